"""The prefix cache: a hit gives what a miss gives (fp32), for LAST embeddings and yes/no reranker scores.

Tiny random decoders (every weight random) loaded through the real path; the same runner with its cache
off is the reference. Batches mix misses, full and partial hits, prefixes shared within the batch and
sequences the cache must leave alone (MEAN-free here: token tasks), and run again after eviction.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.prefix_cache import PrefixCache
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.build import load_model
from tests.workers.models.test_decoder_golden import CASES, save_tiny

PREFIX = [2] + [11, 12, 13, 14, 15, 16, 17] * 5  # 36 tokens: a "system + instruction + query" head
DOCS = [[20 + i, 30 + i] * (3 + 2 * i) + [3] for i in range(6)]
FAMILIES = ["qwen3", "qwen2-sliding", "llama", "llama-bias-llama3-rope", "gemma", "mistral-sliding", "gemma2-softcap",
            "gemma3"]  # every packed causal decoder family (test_decoder_golden.CASES)


def _load(folder, **kw):
    cfg = {"dtype": "float32", "max_batch_tokens": 1024, "prefix_cache_mb": 0, **kw}
    return load_model(WorkerConfig(model=str(folder), served_model_name="t", **cfg))


def _run(runner, ids, params=PoolingParams()) -> np.ndarray:
    outs = runner.execute(runner.prepare([Sequence(list(x), params) for x in ids]))
    return np.concatenate([o.rows.values for o in outs])


def _cache(runner, max_bytes=64 << 20, block=4, block_bytes=None) -> PrefixCache:
    runner.prefix_cache = PrefixCache(runner.pooler, max_bytes, block=block, group_attention=runner.group_attention,
                                      block_bytes=block_bytes)
    return runner.prefix_cache


def _close(got: np.ndarray, want: np.ndarray) -> None:
    cos = (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))
    assert cos.min() >= 0.9999
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", FAMILIES)
def test_hits_misses_and_partial_hits_embed_as_without_the_cache(tmp_path, case):
    model_type, _, extra = CASES[case]
    save_tiny(tmp_path, model_type, CASES[case][1], **extra)
    runner = _load(tmp_path).runner
    first = [PREFIX + d for d in DOCS[:3]]  # a shared prefix not yet cached: computed once per batch (part)
    later = [PREFIX + d for d in DOCS[3:]] + [PREFIX[:10] + DOCS[0], DOCS[1], PREFIX + DOCS[0]]  # hits, partial, miss
    want_first, want_later = _run(runner, first), _run(runner, later)
    cache = _cache(runner)
    _close(_run(runner, first), want_first)
    stats = cache.stats()
    assert stats["shared_tokens"] >= 36 and stats["hit_tokens"] == 0 and stats["bytes"] > 0
    _close(_run(runner, later), want_later)
    assert cache.stats()["hit_tokens"] >= 4 * 36 + 8  # four full prefixes, and 8 tokens of the cut one


def test_yes_no_reranker_scores_equal_the_uncached_ones_and_after_eviction(tmp_path):
    save_tiny(tmp_path, "qwen3", "Qwen3ForCausalLM", auto=AutoModelForCausalLM, head_dim=32)
    model = _load(tmp_path, convert="classify", hf_overrides={"classifier_from_token": ["w1", "w2"]})
    runner, params = model.runner, PoolingParams(task="classify")
    pairs = [PREFIX + d for d in DOCS]
    want = _run(runner, pairs, params)
    cache = _cache(runner)
    _close(_run(runner, pairs, params), want)
    _close(_run(runner, pairs, params), want)  # every prefix a hit now
    assert cache.stats()["hit_tokens"] > 0
    one_block = next(iter(cache._table.values())).nbytes
    small = _cache(runner, max_bytes=5 * one_block)  # evicts as it goes
    for _ in range(2):
        _close(_run(runner, pairs, params), want)
        assert small.stats()["bytes"] <= 5 * one_block


def test_token_tasks_and_bidirectional_models_are_left_alone(tmp_path):
    save_tiny(tmp_path, "qwen3", "Qwen3ForCausalLM", auto=AutoModelForCausalLM, head_dim=32)
    model = _load(tmp_path, runner="pooling", prefix_cache_mb=16)
    cache = model.runner.prefix_cache
    assert cache is not None
    tokens = PoolingParams(task="token_embed")
    assert not cache.eligible(Sequence(PREFIX, tokens)) and cache.eligible(Sequence(PREFIX, PoolingParams()))
    mixed = [Sequence(PREFIX + d, tokens if i % 2 else PoolingParams()) for i, d in enumerate(DOCS)]
    plain = _load(tmp_path, runner="pooling").runner
    for _ in range(2):
        got = model.runner.execute(model.runner.prepare(mixed))
        want = plain.execute(plain.prepare(mixed))
        for g, w in zip(got, want):
            _close(g.rows.values, w.rows.values)
    assert cache.most_captured == (16 << 20) // next(iter(cache._table.values())).nbytes  # sized from the config
    save_tiny(tmp_path / "bi", "qwen3", "Qwen3Model", head_dim=32, is_causal=False)
    assert _load(tmp_path / "bi", prefix_cache_mb=16).runner.prefix_cache is None


def test_a_sequence_always_computes_its_last_token(tmp_path):
    save_tiny(tmp_path, "qwen3", "Qwen3Model", head_dim=32)
    runner = _load(tmp_path).runner
    cache = _cache(runner)
    seqs = [Sequence(PREFIX[:8], PoolingParams()), Sequence(PREFIX[:8], PoolingParams())]  # two whole blocks
    skips = cache.plan(seqs).skips
    assert skips == [0, 4]  # the second shares the first block, never its own last one
    torch.testing.assert_close(torch.from_numpy(_run(runner, [PREFIX[:8]] * 2)[1]),
                               torch.from_numpy(_run(runner, [PREFIX[:8]])[0]), atol=1e-5, rtol=0)


def test_through_the_engine_an_instruction_prefix_hits_and_the_health_answer_counts_it(tmp_path):
    from poolgate.workers.offline import PoolingModel

    save_tiny(tmp_path, "qwen3", "Qwen3Model", head_dim=32)
    instruct = " ".join(f"w{i % 40}" for i in range(40)) + " "  # "Instruct: …\nQuery: " of an embedder
    texts = [instruct + " ".join(f"w{50 + j}" for j in range(i + 2)) for i in range(5)]
    with PoolingModel(str(tmp_path), dtype="float32", prefix_cache_mb=0) as plain:
        want = plain.embed(texts)
        assert "prefix_cache" not in plain._engine.load()
    with PoolingModel(str(tmp_path), dtype="float32", prefix_cache_mb=16) as cached:
        before = cached._engine.load()["prefix_cache"]  # start-up's warm-up ran through it too
        for _ in range(2):
            _close(cached.embed(texts), want)
        after = cached._engine.load()["prefix_cache"]
    grew = {k: after[k] - before[k] for k in ("looked_up_tokens", "hit_tokens", "shared_tokens")}
    assert grew["looked_up_tokens"] == 2 * sum(len(t.split()) + 2 for t in texts)  # [CLS] … [SEP]
    # blocks of 16: 32 of the 41 head tokens; shared within the first call's batch (parts), hit by the second
    assert grew["shared_tokens"] >= 32 and grew["hit_tokens"] >= 5 * 32 and after["bytes"] > 0


def test_a_full_cache_keeps_the_shared_head_over_the_documents_behind_it(tmp_path):
    save_tiny(tmp_path, "qwen3", "Qwen3Model", head_dim=32)
    runner = _load(tmp_path).runner
    probe = _cache(runner)
    _run(runner, [PREFIX + DOCS[0]])
    block = next(iter(probe._table.values())).nbytes
    cache = _cache(runner, max_bytes=12 * block, block_bytes=block)  # the head's 9 blocks and 3 more
    plan = cache.plan([Sequence(PREFIX + d, PoolingParams()) for d in DOCS]).plan
    assert plan is not None and len(plan.keys) == 12  # a batch captures no more than the cache holds
    cache = _cache(runner, max_bytes=12 * block, block_bytes=block)
    _run(runner, [PREFIX + d for d in DOCS])  # far more blocks than it holds
    before = cache.stats()["hit_tokens"]
    _run(runner, [PREFIX + d[::-1] for d in DOCS])  # the same head, other documents
    assert cache.stats()["hit_tokens"] - before == len(DOCS) * 36 and cache.stats()["bytes"] <= 12 * block
