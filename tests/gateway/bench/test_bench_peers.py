"""``poolgate bench --compare-peers``: each CPU peer's vectors against sentence-transformers float32, and the report."""
from __future__ import annotations

import argparse
import asyncio
import json

import numpy as np
import pytest

from poolgate.gateway.bench import peers as bench_peers
from poolgate.gateway.bench.accuracy import cosines
from poolgate.shared.domain.corpus import synthetic_corpus
from poolgate.workers.tools import peers as worker_peers
from tests.fakes import make_tiny_checkpoint
from tests.gateway.bench.test_bench_load import parse, serve  # noqa: F401  (fixture)

RUNTIME_PEERS = ("onnxruntime", "openvino", "openvino-bf16")


def st_folder(path, pooling: str, normalize: bool):
    """A tiny random BERT as a sentence-transformers folder: transformer, ``pooling``, then Normalize if asked."""
    make_tiny_checkpoint(path)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40, "do_lower_case": False}))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode": pooling}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    return path


def texts():
    # synthetic words are mostly outside the tiny vocabulary; lengths from 1 to past max_seq_length, so batches pad
    # and the longest truncate
    words = [f"w{i}" for i in range(40)]
    return [" ".join(words[: 1 + (7 * i) % 60]) for i in range(37)] + synthetic_corpus(11, 3)


def test_the_peer_names_agree():
    assert bench_peers.PEERS == worker_peers.PEERS


def test_peer_list_flag():
    assert bench_peers.peer_list("all") == list(bench_peers.PEERS)
    assert bench_peers.peer_list("openvino, onnxruntime,openvino") == ["openvino", "onnxruntime"]
    for bad in ("", "onnx", "onnxruntime,tensorrt"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_peers.peer_list(bad)


@pytest.mark.parametrize(("pooling", "normalize"), [("mean", True), ("cls", False)])
def test_each_peer_matches_sentence_transformers_fp32(tmp_path, pooling, normalize):
    from poolgate.workers.tools.st_reference import run_reference

    folder = str(st_folder(tmp_path / "st", pooling, normalize))
    corpus = texts()
    results, vectors = worker_peers.run_peers(corpus, model_path=folder, peers=list(worker_peers.PEERS), threads=1,
                                              batch_size=8)
    ref: list = []
    st = run_reference(corpus, model_path=folder, batch_size=8, warmup_texts=4, vectors_out=ref)
    ran = 0
    for name, got in results.items():
        if "skipped" in got:
            assert name not in RUNTIME_PEERS or worker_peers.missing(name), got  # installed runtimes must run
            continue
        ran += 1
        cos = cosines(vectors[name], ref[0])
        assert cos.min() >= 0.999, (name, cos.min())
        if not normalize:  # the CLS vectors themselves, not only their direction
            np.testing.assert_allclose(vectors[name], ref[0], rtol=0.05, atol=0.05 if "bf16" in name else 1e-4)
        assert got["prompt_tokens"] == st["prompt_tokens"] and got["inputs"] == len(corpus), name
        assert got["threads"] == 1 and got["embedding_dim"] == 32 and got["tokens_per_s"] > 0, name
    for name in RUNTIME_PEERS:
        if worker_peers.missing(name):
            pytest.skip(f"{name}: {worker_peers.missing(name)}")
    assert ran >= len(RUNTIME_PEERS)


def test_unavailable_peers_are_skipped_with_the_reason(tmp_path):
    folder = str(st_folder(tmp_path / "st", "mean", True))
    gone = [name for name in worker_peers.PEERS if worker_peers.missing(name)]
    if not gone:
        pytest.skip("every peer is installed here")
    results, vectors = worker_peers.run_peers(["a b c"], model_path=folder, peers=gone, threads=1)
    assert not vectors
    for name in gone:
        assert results[name] == {"skipped": worker_peers.missing(name)} and "pip install" in results[name]["skipped"]


async def test_bench_reports_the_peers_beside_poolgate(serve, tmp_path, capsys):  # noqa: F811
    """The whole flag through ``main``: the fake server's rate, each peer's ratio, cosine, dtype and threads, the
    fastest accurate peer and the CPU."""
    from poolgate.gateway.bench.cli import main

    if worker_peers.missing("onnxruntime"):
        pytest.skip(worker_peers.missing("onnxruntime"))
    folder = str(st_folder(tmp_path / "st", "mean", True))
    _, url = await serve()
    args = parse("--url", url, "--num-texts", "24", "--batch-size", "6", "--warmup", "0", "--st-model", folder,
                 "--st-batch-size", "8", "--compare-peers", "all", "--peer-threads", "1")
    assert await asyncio.to_thread(main, args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    assert set(report["peers"]) == set(bench_peers.PEERS) and report["peer_threads"] == 1
    assert report["cpu"]["class"] and report["cpu"]["model"]
    ran = {n: p for n, p in report["peers"].items() if "skipped" not in p}
    assert "onnxruntime" in ran
    for name, p in ran.items():
        assert p["ratio"] == pytest.approx(report["tokens_per_s"] / p["tokens_per_s"]), name
        assert p["worst_cosine"] >= 0.999 and p["accurate"] is True and p["threads"] == 1 and p["dtype"], name
    fastest = max(ran, key=lambda n: ran[n]["tokens_per_s"])
    assert report["fastest_accurate_peer"] == fastest
    assert report["ratio_vs_fastest_accurate_peer"] == pytest.approx(ran[fastest]["ratio"])
    assert any(line.startswith("  fastest accurate peer: " + fastest) for line in out)
    assert any(line.startswith(f"CPU peers on {report['cpu']['model']} (class {report['cpu']['class']})")
               for line in out)
    assert not any("failed requests" in line for line in out)
    for name, p in report["peers"].items():
        if "skipped" in p:
            assert any(line.startswith(f"  {name}: skipped, ") for line in out)


def test_an_inaccurate_peer_is_not_the_fastest_accurate_one():
    fp32 = np.eye(4, dtype=np.float32)
    results = {"onnxruntime": {"tokens_per_s": 50.0}, "openvino": {"tokens_per_s": 400.0}, "st-onnx": {"skipped": "x"}}
    vectors = {"onnxruntime": fp32 + 1e-4, "openvino": fp32[::-1].copy()}  # openvino: fast, the wrong vectors
    out = bench_peers.score({"tokens_per_s": 100.0}, results, vectors, fp32)
    assert out["peers"]["openvino"]["accurate"] is False and out["peers"]["openvino"]["worst_cosine"] < 0.999
    assert out["peers"]["openvino"]["ratio"] == pytest.approx(0.25) and out["peers"]["onnxruntime"]["accurate"]
    assert out["fastest_accurate_peer"] == "onnxruntime" and out["ratio_vs_fastest_accurate_peer"] == pytest.approx(2.0)
    none = bench_peers.score({"tokens_per_s": 100.0}, {"openvino": {"tokens_per_s": 400.0}},
                             {"openvino": fp32[::-1].copy()}, fp32)
    assert none["fastest_accurate_peer"] is None and none["ratio_vs_fastest_accurate_peer"] is None


def test_openvino_follows_the_onednn_cap(tmp_path):
    """Under a class cap (ONEDNN_MAX_CPU_ISA, as POOLGATE_CPU_CLASS sets it) OpenVINO gets the same cap for its own
    kernels (alone, the oneDNN cap makes it fail to compile) and bf16 falls back to float32 on AVX2."""
    import os
    import subprocess
    import sys

    from poolgate.shared.config.cpu import machine_flags

    if worker_peers.missing("openvino"):
        pytest.skip(worker_peers.missing("openvino"))
    if not {"avx512_bf16", "amx_bf16"} & machine_flags():
        pytest.skip("the bf16 fallback shows only on a CPU with bf16 instructions")
    folder = str(st_folder(tmp_path / "st", "mean", True))
    code = ("import json, sys; from poolgate.workers.tools.peers import run_peers; "
            "r, _ = run_peers(['a b c', 'd e'] * 4, model_path=sys.argv[1], peers=['openvino-bf16'], threads=1); "
            "print(json.dumps(r['openvino-bf16']))")
    env = {k: v for k, v in os.environ.items() if k != "OV_CPU_MAX_ISA"} | {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code, folder], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["isa_cap"] == "AVX2" and got["dtype"] == "float32", got


def test_the_table_says_when_poolgate_had_failed_requests():
    fp32 = np.eye(4, dtype=np.float32)
    report = bench_peers.score({"tokens_per_s": 100.0, "errors": 3}, {"openvino": {"tokens_per_s": 50.0, "dtype": "f"}},
                               {"openvino": fp32}, fp32)
    report.update(cpu={"class": "avx2", "model": "x"}, peer_threads=2)
    table = bench_peers.format_peers(report)
    assert "poolgate's run had 3 failed requests" in table and "poolgate / it: 2.00x" in table
    report["errors"] = 0
    assert "failed requests" not in bench_peers.format_peers(report)
