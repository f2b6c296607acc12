"""The engine's homes for policy: a call's priority and deadline on each Sequence, the batch policy object,
the bounded queue answering Overloaded, a big call tokenized in slices."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from poolgate.shared.domain.errors import DeadlineExceeded, InvalidRequest, Overloaded
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.engine import QUEUE_BUDGETS, Engine
from poolgate.workers.engine.policy import BatchCut, FifoPolicy
from tests.fakes import fake_ids, fake_model, fake_vector, running_engine


def call(*inputs, priority: int = 0, deadline: float | None = None) -> PoolingCall:
    return PoolingCall(request_id="r", model="fake-model", inputs=list(inputs), priority=priority, deadline=deadline)


class LastInFirstOut(FifoPolicy):
    """A policy unlike FIFO, to show the scheduler cuts batches with the policy it is given."""

    def cut(self, batch: BatchCut) -> None:
        while self._queue and batch.fits(self._queue[-1]):
            batch.take(self._queue.pop())


async def hold_first(engine: Engine, runner) -> asyncio.Task:
    runner.release.clear()
    first = asyncio.create_task(engine.submit(call([1])))
    await asyncio.to_thread(runner.entered.wait, 2)
    return first


async def test_each_sequence_carries_its_calls_priority_deadline_and_arrival():
    model = fake_model(max_batch_tokens=64)
    async with running_engine(model) as engine:
        before = time.monotonic()
        deadline = time.time() + 60
        await engine.submit(call([5, 6], [7], priority=7, deadline=deadline))
        seqs = model.runner.batches[-1]
        assert [(s.priority, s.deadline) for s in seqs] == [(7, deadline), (7, deadline)]
        assert seqs[0].arrival == seqs[1].arrival and before <= seqs[0].arrival <= time.monotonic()


async def test_each_sequence_carries_its_calls_lane():
    model = fake_model(max_batch_tokens=64)
    async with running_engine(model) as engine:
        await engine.submit(PoolingCall(request_id="j", model="fake-model", inputs=[[5], [6]], lane="bulk"))
        await engine.submit(call([7]))
        assert [[s.lane for s in batch] for batch in model.runner.batches] == [["bulk", "bulk"], ["live"]]


async def test_the_batch_cut_is_the_policy_objects():
    model = fake_model(max_batch_tokens=64)
    async with running_engine(model, policy=LastInFirstOut()) as engine:
        first = await hold_first(engine, model.runner)
        older = asyncio.create_task(engine.submit(call([2])))
        await asyncio.sleep(0.05)
        newer = asyncio.create_task(engine.submit(call([3])))
        await asyncio.sleep(0.05)
        model.runner.release.set()
        await asyncio.gather(first, older, newer)
        assert [[s.token_ids for s in b] for b in model.runner.batches[1:]] == [[[3], [2]]]


async def test_a_full_queue_answers_overloaded_and_queues_nothing_of_the_call():
    model = fake_model(max_batch_tokens=64)
    async with running_engine(model, max_queued_tokens=4) as engine:
        first = await hold_first(engine, model.runner)
        queued = asyncio.create_task(engine.submit(call([2, 3, 4])))  # 3 tokens: fits the bound of 4
        await asyncio.sleep(0.05)
        assert engine.scheduler.queued_tokens == 3
        with pytest.raises(Overloaded, match="queue is full"):
            await engine.submit(call([5], [6]))  # 2 more tokens would be 5 > 4
        assert engine.scheduler.queued_tokens == 3  # whole or not at all
        model.runner.release.set()
        await asyncio.gather(first, queued)
        big = await engine.submit(call(list(range(10, 20))))  # an empty queue takes a call over the bound
        assert big.prompt_tokens == [10]


def test_the_default_queue_bound_is_a_number_of_token_budgets():
    engine = Engine(fake_model(max_batch_tokens=64))
    assert engine.scheduler.max_queued_tokens == QUEUE_BUDGETS * 64
    assert Engine(fake_model(max_batch_tokens=64), max_queued_tokens=100).scheduler.max_queued_tokens == 100


async def test_a_call_of_many_inputs_keeps_its_order():
    model = fake_model(max_batch_tokens=4096, max_model_len=8)
    async with running_engine(model) as engine:
        texts = [f"t{i}" for i in range(261)]
        result = await engine.submit(call(*texts))
        assert result.prompt_tokens == [3] * len(texts)
        assert [c for batch, _ in model.encoder.calls for c in batch] == texts
        np.testing.assert_array_equal(result.outputs.item(len(texts) - 1), fake_vector(fake_ids(texts[-1])))


async def test_a_call_that_cannot_finish_by_its_deadline_is_dropped_before_the_device():
    model = fake_model(max_batch_tokens=64)
    async with running_engine(model) as engine:
        engine.stats.tokens_per_s = 10.0  # measured: 10 tokens per second of device time
        with pytest.raises(DeadlineExceeded, match="deadline exceeded"):
            await engine.submit(call(list(range(1, 21)), deadline=time.time() + 1.0))  # needs ~2 s
        assert model.runner.batches == []
        result = await engine.submit(call([1, 2], deadline=time.time() + 1.0))  # ~0.2 s: runs
        assert result.prompt_tokens == [2]


async def test_a_request_over_max_tokens_per_request_is_a_400_naming_the_flag():
    model = fake_model(max_batch_tokens=64)
    async with running_engine(model, max_tokens_per_request=5) as engine:
        assert (await engine.submit(call([1, 2], [3, 4, 5]))).prompt_tokens == [2, 3]
        with pytest.raises(InvalidRequest, match=r"have 6 tokens; the limit is 5 tokens per request "
                                                 r"\(--max-tokens-per-request\)"):
            await engine.submit(call([1, 2, 3], [4, 5, 6]))


def test_the_measured_rate_weighs_batches_by_their_tokens():
    from poolgate.workers.engine.stats import PipelineStats

    stats = PipelineStats()
    stats.record_batch(100, 8000, 8192, 0.5)  # 16,000 tokens/s
    for _ in range(5):
        stats.record_batch(1, 4, 8192, 0.004)  # tiny batches at 1,000 tokens/s hardly move it
    assert 14_000 < stats.tokens_per_s < 16_000
    assert "tokens_per_s" in stats.to_wire() and not any(k.startswith("_") for k in stats.to_wire())
