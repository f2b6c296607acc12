"""``poolgate bench --gateway-only`` and ``--latency``: a gateway in front of the zero-cost worker, measured alone."""
import json
import subprocess
import sys

import numpy as np

from poolgate.shared.domain.corpus import fixed_length_corpus
from poolgate.shared.domain.params import PoolingParams
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


def test_gateway_processes_share_one_port_and_one_worker():
    """serve --gateway-processes 2: two gateway processes on one port, both ready and serving, one /metrics
    counting the requests of both, in front of the same zero-cost worker; and the bench reports one and two."""
    import re
    import urllib.request

    from poolgate.gateway.bench.gateway_only import null_gateway

    with null_gateway(2) as gateway:
        assert len(gateway.pids) == 2
        body = json.dumps({"model": "null", "input": "a b c"}).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {gateway.key}"}
        for _ in range(40):  # a new connection each: the kernel picks a process per connection
            req = urllib.request.Request(f"{gateway.url}/v1/embeddings", data=body, headers=headers)
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert resp.status == 200 and len(json.loads(resp.read())["data"][0]["embedding"]) == 384
        for _ in range(4):  # whichever process answers the scrape: both processes' requests
            text = urllib.request.urlopen(gateway.metrics, timeout=10).read().decode()
            served = re.findall(
                r'^poolgate_requests_total\{[^}]*route="/v1/embeddings"[^}]*status="200"[^}]*\} (\S+)$', text, re.M)
            assert served == ["40.0"], served
    done = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", "bench", "--gateway-only", "--num-texts", "16",
                           "--concurrency", "2", "--warmup", "0", "--gateway-processes", "2"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.splitlines()[-1])["runs"]
    assert [r["gateway_processes"] for r in runs] == [1] * 4 + [2] * 4 and all(r["errors"] == 0 for r in runs)
