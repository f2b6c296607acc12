"""``poolgate bench-arch``: both paths run the same batches in one process and agree; bad shapes exit 2."""
import json

import pytest

from poolgate.gateway.cli import main as poolgate
from poolgate.workers.tools import bench_arch
from poolgate.workers.tools.bench_arch import BenchConfig, batches, run


def test_fifo_batches_fill_the_budget_in_order():
    ids = [[1] * n for n in (3, 4, 2, 6, 1)]
    assert [[len(s) for s in b] for b in batches(ids, 7)] == [[3, 4], [2], [6, 1]]
    assert [[len(s) for s in b] for b in batches([[1] * 9], 4)] == [[9]]  # a long text still runs, alone


def test_tiny_modernbert_run_reports_both_paths():
    report = run(BenchConfig(family="modernbert", shape="tiny", num_texts=12, batch_tokens=400, max_len=96))
    assert report["packed"]["implementation"] == "packed modernbert"
    assert report["fallback"]["implementation"] == "transformers fallback (padded)"
    assert report["texts"] == 12 and report["batches"] >= 2 and report["tokens"] > 12 * 5
    for path in ("packed", "fallback"):
        assert report[path]["tokens_per_s"] > 0
    assert report["speedup"] == pytest.approx(report["packed"]["tokens_per_s"] / report["fallback"]["tokens_per_s"],
                                              rel=1e-2)
    assert report["worst_cosine_first_batch"] >= 0.9999  # same weights, same batch: the two paths agree


def test_cli_prints_table_and_json(capsys):
    code = poolgate(["bench-arch", "--family", "modernbert", "--shape", "tiny", "--num-texts", "6",
                     "--max-model-len", "64", "--sorted"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert "packed / fallback:" in out[-2] and out[1].strip().startswith("packed modernbert")
    report = json.loads(out[-1])
    assert report["order"] == "length-sorted" and report["shape"] == "tiny"


def test_unknown_shape_is_exit_2(capsys):
    assert poolgate(["bench-arch", "--family", "modernbert", "--shape", "huge"]) == 2
    assert "no shape modernbert/huge (known: " in capsys.readouterr().err


def test_shape_without_packed_family_is_exit_2(capsys, monkeypatch):
    monkeypatch.setitem(bench_arch.SHAPES, "electra", {"tiny": dict(
        model_type="electra", architecture="ElectraModel", hidden_size=32, embedding_size=32, num_hidden_layers=1,
        num_attention_heads=4, intermediate_size=64, vocab_size=30522)})
    assert poolgate(["bench-arch", "--family", "electra", "--shape", "tiny", "--num-texts", "2"]) == 2
    assert "ElectraModel has no packed implementation" in capsys.readouterr().err
