"""Chunked processing of long embed inputs over the fake model: split, batches, fold, caps, truncation."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from poolgate.shared.domain.errors import ContextLengthExceeded, InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.load.build import _check_chunking
from poolgate.workers.engine.chunking import Chunks, fold, split
from tests.fakes import fake_ids, fake_model, fake_output, fake_vector, running_engine

MAX_LEN = 32


def call(*inputs, **params) -> PoolingCall:
    return PoolingCall(request_id="r", model="fake-model", inputs=list(inputs), params=PoolingParams(**params))


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def chunked_mean(ids: list[int], *, normalize: bool | None = None, size: int = MAX_LEN) -> np.ndarray:
    """By hand: the token-weighted mean of the fake runner's chunk vectors, re-normalized unless turned off."""
    chunks = [ids[i:i + size] for i in range(0, len(ids), size)]
    vectors = np.stack([fake_vector(c, normalize=normalize) for c in chunks]).astype(np.float64)
    mean = (vectors * np.array([len(c) for c in chunks])[:, None]).sum(0) / len(ids)
    return mean / np.linalg.norm(mean) if normalize is not False and len(chunks) > 1 else mean


@contextlib.asynccontextmanager
async def engine_for(**kw):
    model = fake_model(max_model_len=MAX_LEN, **kw)
    async with running_engine(model) as engine:
        yield engine, model.runner


async def test_a_long_input_runs_as_chunks_across_batches_and_folds_back_in_order():
    long = words(110)  # 112 tokens = 3.5 x max_model_len: chunks of 32, 32, 32, 16
    ids = fake_ids(long)
    async with engine_for(chunked=True, max_batch_tokens=64) as (engine, runner):
        result = await engine.submit(call("a b", long, [5, 6]))
    sent = [s.token_ids for batch in runner.batches for s in batch]
    assert sent == [fake_ids("a b"), ids[:32], ids[32:64], ids[64:96], ids[96:], [5, 6]]
    assert [len(b) for b in runner.batches] == [2, 2, 2]  # the chunks land in three batches
    assert result.prompt_tokens == [4, 112, 2]  # every token of the long input counts
    assert result.outputs.values.shape == (3, 8) and result.outputs.values.dtype == np.float32
    np.testing.assert_array_equal(result.outputs.item(0), fake_vector(fake_ids("a b")))  # short rows exact
    np.testing.assert_array_equal(result.outputs.item(2), fake_vector([5, 6]))
    np.testing.assert_allclose(result.outputs.item(1), chunked_mean(ids), rtol=1e-6, atol=1e-7)
    assert abs(np.linalg.norm(result.outputs.item(1)) - 1) < 1e-6


async def test_use_activation_false_is_the_plain_weighted_mean():
    ids = list(range(1, 101))  # 32, 32, 32, 4
    async with engine_for(chunked=True) as (engine, _):
        result = await engine.submit(call(ids, use_activation=False))
    assert result.prompt_tokens == [100]
    np.testing.assert_allclose(result.outputs.item(0), chunked_mean(ids, normalize=False), rtol=1e-6)


async def test_max_embed_len_caps_the_input_with_vllms_message():
    async with engine_for(chunked=True, max_embed_len=100) as (engine, _):
        ok = await engine.submit(call(list(range(1, 101))))
        assert ok.prompt_tokens == [100]
        with pytest.raises(ContextLengthExceeded) as err:
            await engine.submit(call("ok", words(110)))
    assert str(err.value) == (
        "This model's maximum context length is 100 tokens. However, your prompt contains 112 input "
        "tokens, which exceeds this limit even without any output tokens. Please reduce the length "
        "of the input prompt.")
    assert err.value.param == "input_tokens"


async def test_without_chunking_a_long_input_is_todays_400():
    async with engine_for() as (engine, _):
        with pytest.raises(ContextLengthExceeded, match="maximum context length is 32 tokens. However, your "
                                                         "prompt contains 112 input tokens"):
            await engine.submit(call(words(110)))


async def test_truncation_applies_before_chunking():
    long = words(110)
    async with engine_for(chunked=True, max_embed_len=100) as (engine, runner):
        cut = await engine.submit(call(long, truncate_prompt_tokens=80))
        capped = await engine.submit(call(long, truncate_prompt_tokens=-1))  # -1 = the cap, max_embed_len
        with pytest.raises(InvalidRequest, match="greater than max_embed_len") as err:
            await engine.submit(call(long, truncate_prompt_tokens=101))
    assert err.value.param == "truncate_prompt_tokens"
    assert (cut.prompt_tokens, capped.prompt_tokens) == ([80], [100])
    np.testing.assert_allclose(cut.outputs.item(0), chunked_mean(fake_ids(long, 80)), rtol=1e-6, atol=1e-7)
    assert [len(s.token_ids) for s in runner.batches[0] + runner.batches[1]][:3] == [32, 32, 16]


async def test_with_no_cap_minus_one_truncates_nothing():
    async with engine_for(chunked=True) as (engine, _):
        result = await engine.submit(call(words(300), truncate_prompt_tokens=-1))
        far = await engine.submit(call(words(300), truncate_prompt_tokens=250))
    assert (result.prompt_tokens, far.prompt_tokens) == ([302], [250])


async def test_other_tasks_are_not_chunked():
    async with engine_for(chunked=True, tasks=("embed", "token_embed")) as (engine, runner):
        with pytest.raises(ContextLengthExceeded, match="maximum context length is 32 tokens"):
            await engine.submit(call(words(40), task="token_embed"))
        with pytest.raises(InvalidRequest, match="greater than max_model_len"):
            await engine.submit(call("a", task="token_embed", truncate_prompt_tokens=33))
        result = await engine.submit(call(words(40), task="token_embed", truncate_prompt_tokens=-1))
    assert result.prompt_tokens == [32] and len(result.outputs.item(0)) == 32
    ids = fake_ids(words(40), 32)
    np.testing.assert_array_equal(result.outputs.item(0), fake_output(ids, PoolingParams(task="token_embed")))


def test_split_leaves_short_inputs_alone():
    ids = [[1, 2, 3], [4, 5]]
    assert split(ids, 3, PoolingParams()) == (ids, None)
    seqs, chunks = split([[1, 2, 3, 4, 5, 6, 7], [8]], 3, PoolingParams(use_activation=False))
    assert seqs == [[1, 2, 3], [4, 5, 6], [7], [8]]
    assert chunks.counts.tolist() == [3, 1] and chunks.weights.tolist() == [3, 3, 1, 1]
    assert not chunks.renormalize


def test_fold_renormalizes_only_when_every_chunk_was_unit_norm():
    unit = np.array([[1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32)  # input 0: two chunks, input 1: one
    chunks = Chunks(np.array([2, 1]), np.array([3.0, 1.0, 5.0]), renormalize=True)
    out = fold(Rows(unit), chunks).values
    np.testing.assert_allclose(out[0], np.array([0.75, 0.25]) / np.linalg.norm([0.75, 0.25]), rtol=1e-6)
    np.testing.assert_array_equal(out[1], unit[2])
    raw = unit * 2  # not unit norm: vLLM keeps the plain mean
    np.testing.assert_allclose(fold(Rows(raw), chunks).values[0], [1.5, 0.5], rtol=1e-6)


@pytest.mark.parametrize("poolers, message", [
    ({"embed": SimpleNamespace(method="CLS", pool=None)}, "needs MEAN pooling, but this model pools embed with CLS"),
    ({"embed": SimpleNamespace(method="SPLADE", pool=object())}, "needs MEAN pooling"),
    ({"classify": SimpleNamespace(method="MEAN", pool=None)}, "applies to the embed task"),
    ({"embed": SimpleNamespace(method="MEAN", pool=None, selects_rows=True)}, "a later chunk does not have"),  # GritLM
])
def test_start_up_refuses_chunking_without_mean_pooling(poolers, message):
    with pytest.raises(ValueError, match=message) as err:
        _check_chunking(SimpleNamespace(poolers=poolers, tasks=tuple(poolers)))
    assert "--pooler-config enable_chunked_processing" in str(err.value)
    mean = SimpleNamespace(method="MEAN", pool=None, selects_rows=False)
    _check_chunking(SimpleNamespace(poolers={"embed": mean}, tasks=("embed",)))
