"""poolgate bench --tokenizer-only: the gateway's input stage over the corpus, counted as the model's tokenizer counts."""
from __future__ import annotations

from poolgate.gateway.bench.tokenizing import MAX_LEN, format_tokenizer_only, run_tokenizer_only
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.corpus import synthetic_corpus
from poolgate.workers.load.hf_tokenizer import read_tokenizer


def test_every_thread_count_tokenizes_the_whole_corpus_as_transformers_counts_it():
    texts = synthetic_corpus(96, 0)
    report = run_tokenizer_only(texts, 32, (1, 2))
    want = sum(len(ids) for ids in read_tokenizer(bundled_model_path())(texts, truncation=True,
                                                                       max_length=MAX_LEN)["input_ids"])
    assert [r["threads"] for r in report["runs"]] == [1, 2]
    for run in report["runs"]:
        assert round(run["tokens_per_s"] * run["wall_s"]) == want and run["texts_per_s"] > 0
    assert "tokens/s" in format_tokenizer_only(report)
