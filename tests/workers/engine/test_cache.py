"""The embedding cache (workers.engine.cache) in a real engine: hits skip the model, bit-identical, LRU by bytes."""
from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np

from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.offline import PoolingModel
from tests.fakes import fake_model, running_engine

TEXTS = ["a b c", "d e", "f g h i"]


def call(inputs, **params) -> PoolingCall:
    return PoolingCall(request_id="r", model="fake-model", inputs=list(inputs), params=PoolingParams(**params))


@contextlib.asynccontextmanager
async def engine_for(cache_bytes: int):
    model = replace(fake_model(tasks=("embed", "token_embed")), cache_bytes=cache_bytes)
    async with running_engine(model) as engine:
        yield engine, model.runner


async def test_a_repeated_input_is_answered_from_the_cache_without_the_model():
    async with engine_for(1 << 20) as (engine, runner):
        first = await engine.submit(call(TEXTS))
        ran = sum(len(b) for b in runner.batches)
        again = await engine.submit(call([TEXTS[1], "new one", TEXTS[0]]))
        assert sum(len(b) for b in runner.batches) == ran + 1  # only "new one" reached the model
        assert np.array_equal(again.outputs.values[0], first.outputs.values[1])
        assert np.array_equal(again.outputs.values[2], first.outputs.values[0])
        assert again.prompt_tokens == [4, 4, 5]  # usage counts hits like misses
        raw = await engine.submit(call(TEXTS[:1], use_activation=False))  # other params: another key
        assert not np.array_equal(raw.outputs.values[0], first.outputs.values[0])
        stats = engine.load()["cache"]
        assert (stats["hits"], stats["misses"], stats["entries"]) == (2, 5, 5) and stats["bytes"] > 0


async def test_token_level_outputs_are_cached_whole():
    async with engine_for(1 << 20) as (engine, runner):
        first = await engine.submit(call(TEXTS, task="token_embed"))
        again = await engine.submit(call(TEXTS, task="token_embed"))
        assert engine.load()["cache"]["hits"] == 3
        assert np.array_equal(again.outputs.values, first.outputs.values)
        assert np.array_equal(again.outputs.offsets, first.outputs.offsets)


async def test_the_table_keeps_the_most_recent_entries_within_its_bytes():
    row_bytes = 8 * 4 + 8 * 4 + 64  # a float32 (8,) row plus the key of a 4-token input, as cache.py counts
    async with engine_for(2 * row_bytes) as (engine, _):
        for text in ("a b", "c d", "e f"):  # 4 tokens each: the third pushes out the first
            await engine.submit(call([text]))
        stats = engine.load()["cache"]
        assert stats["entries"] == 2 and stats["bytes"] <= 2 * row_bytes
        await engine.submit(call(["e f", "a b"]))
        assert engine.load()["cache"]["hits"] == 1  # "e f" stayed, "a b" was evicted


def test_a_real_model_hit_is_bit_identical_to_its_miss():
    texts = ["The quick brown fox jumps over the lazy dog.", "Zürich, São Paulo and Kraków", "x " * 60]
    with PoolingModel(dtype="float32", embedding_cache_mb=16) as model:
        first, second = model.embed(texts), model.embed(texts[::-1])
        assert np.array_equal(second[::-1], first)
        assert model._engine.load()["cache"]["hits"] == 3
    without = PoolingModel(dtype="float32")
    with without:
        np.testing.assert_allclose(without.embed(texts), first, atol=1e-6)  # and the cache changed nothing
        assert "cache" not in without._engine.load()
