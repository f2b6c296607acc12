"""Engine over FakeRunner: order, batching, truncation, limits, cancellation, failures, deadlines."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from poolgate.shared.errors import (
    ContextLengthExceeded, DeadlineExceeded, InternalError, InvalidRequest, NotSupported, Unavailable,
)
from poolgate.shared.params import PoolingParams
from poolgate.shared.wire import PoolingCall
from tests.conftest import CLS, SEP, FakeRunner, until
from poolgate.workers.engine import Engine


class GatedRunner(FakeRunner):
    """Records encode calls and their threads; a token 666 makes the device fail."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.encode_calls: list[tuple[list[str], int | None]] = []
        self.encode_threads: set[int] = set()

    def encode_texts(self, texts, max_tokens=None):
        self.encode_calls.append((list(texts), max_tokens))
        self.encode_threads.add(threading.get_ident())
        return super().encode_texts(texts, max_tokens)

    def run(self, batch):
        if any(s.token_ids[1:2] == [666] for s in batch):
            self.entered.set()
            raise RuntimeError("device fell over")
        return super().run(batch)


def call(*inputs, **params) -> PoolingCall:
    deadline = params.pop("deadline", None)
    return PoolingCall(request_id="r", model="fake-model", inputs=list(inputs),
                       params=PoolingParams(**params), deadline=deadline)


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.fixture
def runner() -> GatedRunner:
    return GatedRunner()


@pytest.fixture
async def engine(runner):
    eng = Engine(runner, max_batch_tokens=64)
    await eng.start()
    yield eng
    runner.release.set()
    await eng.stop()


async def hold_first_batch(engine, runner) -> asyncio.Task:
    """Start one call and keep its batch on the 'device' until runner.release is set."""
    runner.release.clear()
    first = asyncio.create_task(engine.submit(call("hold")))
    await asyncio.to_thread(runner.entered.wait, 2)
    return first


async def test_results_in_input_order(engine, runner):
    result = await engine.submit(call("hello world", [7, 8, 9], "x"))
    expected_ids = [runner.encode_texts(["hello world"])[0], [7, 8, 9], [CLS, 1000 + ord("x"), SEP]]
    assert result.prompt_tokens == [4, 3, 3]
    for out, ids in zip(result.outputs, expected_ids):
        np.testing.assert_array_equal(out, runner.vector(ids))


async def test_tokenizes_off_the_loop_in_one_batched_call(engine, runner):
    await engine.submit(call("a b", [5], "c d e"))
    assert runner.encode_calls == [(["a b", "c d e"], None)]
    assert threading.get_ident() not in runner.encode_threads


async def test_concurrent_calls_share_batches(engine, runner):
    first = await hold_first_batch(engine, runner)
    calls = [asyncio.create_task(engine.submit(call(f"q{i} z", [i + 1]))) for i in range(6)]
    await until(lambda: engine.scheduler.queued == 12)
    assert engine.load() == {"queued": 12, "queued_tokens": 6 * (4 + 1), "running": 1}
    runner.release.set()
    results = await asyncio.gather(*calls)
    await first
    assert [len(b) for b in runner.batches] == [1, 12]  # six calls, one batch
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.outputs[1], runner.vector([i + 1]))
    assert engine.load() == {"queued": 0, "queued_tokens": 0, "running": 0}


async def test_batches_respect_the_token_budget(runner):
    engine = Engine(runner, max_batch_tokens=10)
    await engine.start()
    try:
        first = await hold_first_batch(engine, runner)
        calls = [asyncio.create_task(engine.submit(call(words(2)))) for _ in range(5)]  # 4 tokens each
        await until(lambda: engine.scheduler.queued == 5)
        runner.release.set()
        await asyncio.gather(first, *calls)
        assert [len(b) for b in runner.batches] == [1, 2, 2, 1]
    finally:
        await engine.stop()


async def test_text_over_the_truncation_length_is_re_encoded(engine, runner):
    long, short = words(40), "tiny text"
    result = await engine.submit(call(long, short, truncate_prompt_tokens=10))
    assert result.prompt_tokens == [10, 4]
    assert runner.encode_calls == [([long, short], None), ([long], 10)]
    sent = runner.batches[-1][0].token_ids
    assert sent == runner.encode_texts([long], max_tokens=10)[0]
    assert sent[-1] == SEP  # re-encoded with special tokens, not cut


async def test_truncate_minus_one_means_max_model_len(engine, runner):
    result = await engine.submit(call(words(100), list(range(1, 101)), truncate_prompt_tokens=-1))
    assert result.prompt_tokens == [32, 32]


async def test_token_ids_are_cut_to_their_first_k(engine, runner):
    ids = list(range(1, 41))
    result = await engine.submit(call(ids, truncate_prompt_tokens=10))
    assert result.prompt_tokens == [10]
    assert runner.batches[-1][0].token_ids == ids[:10]
    assert runner.encode_calls == []


async def test_too_long_without_truncation_gets_vllms_message(engine):
    with pytest.raises(ContextLengthExceeded) as err:
        await engine.submit(call("ok", words(40)))
    assert str(err.value) == (
        "This model's maximum context length is 32 tokens. However, your prompt contains 42 input "
        "tokens, which exceeds this limit even without any output tokens. Please reduce the length "
        "of the input prompt.")
    assert err.value.param == "input_tokens"


async def test_empty_token_list_is_a_400(engine):
    with pytest.raises(InvalidRequest, match="The decoder prompt cannot be empty"):
        await engine.submit(call([]))


@pytest.mark.parametrize("bad", [[1.5], ["a"], [-1], [True], {"ids": [1]}, None])
async def test_malformed_inputs_are_a_400(engine, bad):
    with pytest.raises(InvalidRequest) as err:
        await engine.submit(call(bad))
    assert err.value.param == "input"


async def test_dimensions_on_a_non_matryoshka_model(engine):
    with pytest.raises(InvalidRequest, match="does not support Matryoshka") as err:
        await engine.submit(call("a", dimensions=4))
    assert err.value.param == "dimensions"


async def test_dimensions_on_a_matryoshka_model():
    runner = FakeRunner(matryoshka=True)
    engine = Engine(runner, max_batch_tokens=64)
    await engine.start()
    try:
        result = await engine.submit(call("a b", dimensions=4))
        assert result.outputs[0].shape == (4,)
        with pytest.raises(InvalidRequest, match=r"range \[1, 8\]"):
            await engine.submit(call("a", dimensions=9))
    finally:
        await engine.stop()


async def test_unsupported_task(engine):
    with pytest.raises(NotSupported, match="Unsupported task: 'classify'"):
        await engine.submit(call("a", task="classify"))


async def test_a_client_that_leaves_is_never_run(engine, runner):
    first = await hold_first_batch(engine, runner)
    leaving = asyncio.create_task(engine.submit(call([4242], [4243])))
    await until(lambda: engine.scheduler.queued == 2)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert engine.load()["queued"] == 0
    runner.release.set()
    await first
    await engine.submit(call([1]))
    ran = [s.token_ids for batch in runner.batches for s in batch]
    assert [4242] not in ran and [4243] not in ran
    assert [1] in ran


async def test_runner_failure_fails_the_batch_and_the_engine_goes_on(engine, runner):
    first = await hold_first_batch(engine, runner)
    doomed = asyncio.create_task(engine.submit(call([CLS, 666])))
    bystander = asyncio.create_task(engine.submit(call([CLS, 1])))
    await until(lambda: engine.scheduler.queued == 2)
    runner.release.set()
    await first
    for task in (doomed, bystander):  # same batch: both fail
        with pytest.raises(InternalError, match="device fell over"):
            await task
    result = await engine.submit(call("still here"))
    np.testing.assert_array_equal(result.outputs[0], runner.vector(runner.encode_texts(["still here"])[0]))


async def test_deadline_already_passed(engine, runner):
    with pytest.raises(DeadlineExceeded, match="deadline exceeded"):
        await engine.submit(call("a", deadline=time.time() - 1))
    assert runner.batches == []


async def test_deadline_passes_while_queued(engine, runner):
    first = await hold_first_batch(engine, runner)
    late = asyncio.create_task(engine.submit(call([77], deadline=time.time() + 0.1)))
    await until(lambda: engine.scheduler.queued == 1)
    await asyncio.sleep(0.15)
    runner.release.set()
    await first
    with pytest.raises(DeadlineExceeded, match="deadline exceeded"):
        await late
    assert all(s.token_ids != [77] for batch in runner.batches for s in batch)


async def test_stop_finishes_the_running_batch_and_fails_the_queue(runner):
    engine = Engine(runner, max_batch_tokens=64)
    await engine.start()
    first = await hold_first_batch(engine, runner)
    queued = asyncio.create_task(engine.submit(call("later")))
    await until(lambda: engine.scheduler.queued == 1)
    threading.Timer(0.05, runner.release.set).start()
    await engine.stop()
    assert (await first).prompt_tokens == [3]
    with pytest.raises(Unavailable, match="shutting down"):
        await queued
    with pytest.raises(Unavailable):
        await engine.submit(call("after"))


async def test_lone_surrogate_text_is_a_400(engine):
    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        await engine.submit(call("a\ud800b"))


async def test_truncation_below_the_special_tokens_keeps_k(engine):
    result = await engine.submit(call("one two three", truncate_prompt_tokens=1))
    assert result.prompt_tokens == [1]
