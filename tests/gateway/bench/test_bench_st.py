"""``poolgate bench --compare-sentence-transformers`` with the bundled MiniLM (slow)."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from poolgate.shared.models import bundled_model_path
from poolgate.shared.corpus import synthetic_corpus
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
