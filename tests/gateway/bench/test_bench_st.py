"""``poolgate bench --compare-sentence-transformers`` with the bundled MiniLM (slow)."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.corpus import synthetic_corpus
from tests.gateway.bench.test_bench_load import parse, serve  # noqa: F401  (fixture)


def test_bench_modules_do_not_import_torch():
    code = "import sys, poolgate.gateway.bench.cli, poolgate.gateway.bench.report; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.slow
async def test_compare_sentence_transformers_end_to_end(serve, capsys):  # noqa: F811
    from transformers import AutoTokenizer

    from poolgate.gateway.bench.cli import main

    _, url = await serve()
    args = parse("--url", url, "--num-texts", "12", "--batch-size", "4", "--warmup", "1",
                 "--compare-sentence-transformers", "--st-batch-size", "4")
    assert await asyncio.to_thread(main, args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    st = report["sentence_transformers"]
    tok = AutoTokenizer.from_pretrained(bundled_model_path())
    texts = synthetic_corpus(12, 0)
    expected = sum(len(x) for x in tok(texts, truncation=True, max_length=256)["input_ids"])
    assert st["prompt_tokens"] == expected and st["max_seq_length"] == 256
    assert st["inputs"] == 12 and st["embedding_dim"] == 384 and st["tokens_per_s"] > 0
    ratio = report["tokens_per_s"] / st["tokens_per_s"]
    assert report["ratio_vs_sentence_transformers"] == pytest.approx(ratio)
    assert any("poolgate / ST" in line for line in out)


def test_check_cosine_against_a_live_bf16_server(tmp_path):
    """The speed target's accuracy half: every vector a bf16 poolgate serves (packed CPU attention, token buckets)
    at cosine >= 0.999 to sentence-transformers in float32, as ``--check-cosine`` reports it."""
    from tests.live_server import live_server

    with live_server(tmp_path, "--dtype", "bfloat16", "--max-batch-tokens", "2048") as server:
        out = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", "bench", "--url", server.url,
                              "--num-texts", "48", "--batch-size", "8", "--warmup", "1", "--check-cosine",
                              "--compare-sentence-transformers", "--st-dtype", "bfloat16", "--st-batch-size", "8"],
                             capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    cos = json.loads(lines[-1])["cosine_to_fp32"]
    assert cos["vectors"] == 48 and cos["st_dtype"] == "bfloat16", cos
    assert 0.999 <= cos["poolgate_worst"] <= cos["poolgate_mean"] <= 1.0 + 1e-6 and cos["poolgate_below_0.999"] == 0
    assert 0.99 <= cos["st_worst"] <= 1.0 + 1e-6
    assert any("cosine to sentence-transformers float32 over 48 vectors: poolgate worst" in x for x in lines)


async def test_check_cosine_says_when_the_served_model_is_another(serve, capsys):  # noqa: F811
    from poolgate.gateway.bench.cli import main

    _, url = await serve()
    args = parse("--url", url, "--num-texts", "6", "--batch-size", "3", "--warmup", "0", "--check-cosine")
    assert await asyncio.to_thread(main, args) == 1  # a check that could not be made fails
    out = capsys.readouterr().out.strip().splitlines()
    assert "are not the reference's" in json.loads(out[-1])["cosine_to_fp32"]["error"]
    assert any("cosine to float32: the served model's vectors" in line for line in out)
