"""``poolgate bench --gateway-only`` and ``--latency``: a gateway in front of the zero-cost worker, measured alone."""
import json
import subprocess
import sys

import numpy as np

from poolgate.shared.corpus import fixed_length_corpus
from poolgate.shared.params import PoolingParams
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.tools.null_model import ConstantRunner, WordEncoder


def test_gateway_only_runs_every_shape_against_the_zero_cost_worker(tmp_path):
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", "bench", "--gateway-only", "--num-texts", "40",
                           "--concurrency", "4", "--warmup", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(done.stdout.splitlines()[-1]) == report
    shapes = [(r["batch_size"], r["encoding_format"]) for r in report["runs"]]
    assert shapes == [(1, "float"), (1, "base64"), (32, "float"), (32, "base64")]
    for r in report["runs"]:
        assert r["errors"] == 0 and r["inputs"] == 40 and r["embedding_dim"] == 384 and r["requests_per_s"] > 0


def test_zero_cost_model_keeps_shapes_and_runs():
    enc, runner = WordEncoder(), ConstantRunner(dim=4)
    ids = enc.encode(["a b c", "d"], max_tokens=3)
    assert [len(x) for x in ids] == [3, 3] and ids[0][0] == 101 and ids[0][-1] == 102
    seqs = [Sequence(x, PoolingParams(task="embed")) for x in ids] + [Sequence(ids[0], PoolingParams(dimensions=2))]
    outs = runner.execute(runner.prepare(seqs))
    assert [(o.start, o.stop) for o in outs] == [(0, 2), (2, 3)]
    np.testing.assert_allclose(np.linalg.norm(outs[0].rows.values, axis=1), 1.0, rtol=1e-6)


def test_latency_corpus_texts_differ_and_have_the_asked_length():
    texts = fixed_length_corpus(50, 14, seed=3)
    assert len(set(texts)) == 50 and all(len(t.split()) == 14 for t in texts)
    assert texts == fixed_length_corpus(50, 14, seed=3)
