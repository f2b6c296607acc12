"""Engine over the fake model: order, batching, pipelining, truncation, limits, cancellation, failures, deadlines."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from poolgate.shared.domain.errors import (
    ContextLengthExceeded, DeadlineExceeded, InternalError, InvalidRequest, Unavailable,
)
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.engine import Engine
from poolgate.workers.engine.runner_api import RunOutput
from tests.fakes import CLS, FAIL_TOKEN, SEP, FakeRunner, fake_ids, fake_model, fake_vector, until


def call(*inputs, **params) -> PoolingCall:
    deadline = params.pop("deadline", None)
    return PoolingCall(request_id="r", model="fake-model", inputs=list(inputs),
                       params=PoolingParams(**params), deadline=deadline)


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.fixture
def model():
    return fake_model(max_batch_tokens=64)


@pytest.fixture
def runner(model) -> FakeRunner:
    return model.runner


@pytest.fixture
def encoder(model):
    return model.encoder


@pytest.fixture
async def engine(model):
    eng = Engine(model)
    await eng.start()
    yield eng
    model.runner.release.set()
    await eng.stop()


async def started(model) -> Engine:
    eng = Engine(model)
    await eng.start()
    return eng


def load_without_stats(engine) -> dict:
    return {k: v for k, v in engine.load().items() if k != "pipeline"}


async def hold_first_batch(engine, runner) -> asyncio.Task:
    """Start one call and keep its batch on the 'device' until runner.release is set."""
    runner.release.clear()
    first = asyncio.create_task(engine.submit(call("hold")))
    await asyncio.to_thread(runner.entered.wait, 2)
    return first


async def test_results_in_input_order(engine, runner):
    result = await engine.submit(call("hello world", [7, 8, 9], "x"))
    expected_ids = [fake_ids("hello world"), [7, 8, 9], fake_ids("x")]
    assert result.prompt_tokens == [4, 3, 3]
    assert result.outputs.values.shape == (3, 8) and result.outputs.offsets is None  # one block per call
    for i, ids in enumerate(expected_ids):
        np.testing.assert_array_equal(result.outputs.item(i), fake_vector(ids))


async def test_tokenizes_off_the_loop_in_one_batched_call(engine, encoder):
    await engine.submit(call("a b", [5], "c d e"))
    assert encoder.calls == [(["a b", "c d e"], None)]
    assert threading.get_ident() not in encoder.threads


async def test_concurrent_calls_share_batches(engine, runner):
    first = await hold_first_batch(engine, runner)
    calls = [asyncio.create_task(engine.submit(call(f"q{i} z", [i + 1]))) for i in range(6)]
    await until(lambda: engine.scheduler.queued == 12)
    assert load_without_stats(engine) == {"queued": 12, "queued_tokens": 6 * (4 + 1), "running": 1,
                                          "requests_waiting": 6, "requests_running": 1}
    runner.release.set()
    results = await asyncio.gather(*calls)
    await first
    assert [len(b) for b in runner.batches] == [1, 12]  # six calls, one batch
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.outputs.item(1), fake_vector([i + 1]))
    assert load_without_stats(engine) == {"queued": 0, "queued_tokens": 0, "running": 0,
                                          "requests_waiting": 0, "requests_running": 0}
    assert engine.load()["pipeline"]["batches"] == 2 and engine.load()["pipeline"]["sequences"] == 13


async def test_batches_respect_the_token_budget():
    model = fake_model(max_batch_tokens=10)
    runner, engine = model.runner, await started(model)
    try:
        first = await hold_first_batch(engine, runner)
        calls = [asyncio.create_task(engine.submit(call(words(2)))) for _ in range(5)]  # 4 tokens each
        # a full budget is queued, so one batch of 2 is cut and prepared while the first runs
        await until(lambda: engine.scheduler.queued == 3)
        runner.release.set()
        await asyncio.gather(first, *calls)
        assert [len(b) for b in runner.batches] == [1, 2, 2, 1]
    finally:
        await engine.stop()


async def test_text_over_the_truncation_length_is_truncated_by_the_tokenizer(engine, runner, encoder):
    long, short = words(40), "tiny text"
    result = await engine.submit(call(long, short, truncate_prompt_tokens=10))
    assert result.prompt_tokens == [10, 4]
    assert encoder.calls == [([long, short], 10)]  # one batch call, the tokenizer's own truncation
    sent = runner.batches[-1][0].token_ids
    assert sent == fake_ids(long, max_tokens=10)
    assert sent[-1] == SEP  # re-encoded with special tokens, not cut


async def test_truncate_minus_one_means_max_model_len(engine, runner):
    result = await engine.submit(call(words(100), list(range(1, 101)), truncate_prompt_tokens=-1))
    assert result.prompt_tokens == [32, 32]


async def test_token_ids_are_cut_to_their_first_k(engine, runner, encoder):
    ids = list(range(1, 41))
    result = await engine.submit(call(ids, truncate_prompt_tokens=10))
    assert result.prompt_tokens == [10]
    assert runner.batches[-1][0].token_ids == ids[:10]
    assert encoder.calls == []


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
    engine = await started(fake_model(matryoshka=True))
    try:
        result = await engine.submit(call("a b", dimensions=4))
        assert result.outputs.values.shape == (1, 4)
        with pytest.raises(InvalidRequest, match=r"range \[1, 8\]"):
            await engine.submit(call("a", dimensions=9))
    finally:
        await engine.stop()


async def test_unsupported_task(engine):
    with pytest.raises(InvalidRequest, match="Unsupported task: 'classify'"):
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
    doomed = asyncio.create_task(engine.submit(call([CLS, FAIL_TOKEN])))
    bystander = asyncio.create_task(engine.submit(call([CLS, 1])))
    await until(lambda: engine.scheduler.queued == 2)
    runner.release.set()
    await first
    for task in (doomed, bystander):  # same batch: both fail
        with pytest.raises(InternalError, match="device fell over"):
            await task
    result = await engine.submit(call("still here"))
    np.testing.assert_array_equal(result.outputs.item(0), fake_vector(fake_ids("still here")))


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


async def test_stop_finishes_the_running_batch_and_fails_the_queue(model, runner):
    engine = await started(model)
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


async def test_a_call_split_over_batches_comes_back_as_one_block_in_order():
    model = fake_model(max_batch_tokens=10)
    engine = await started(model)
    try:
        texts = [f"t{i} u{i}" for i in range(5)]  # 4 tokens each: batches of 2, 2, 1
        result = await engine.submit(call(*texts))
        assert [len(b) for b in model.runner.batches] == [2, 2, 1]
        assert result.outputs.values.shape == (5, 8)
        np.testing.assert_array_equal(result.outputs.values, np.stack([fake_vector(fake_ids(t)) for t in texts]))
    finally:
        await engine.stop()


async def test_calls_with_different_params_share_a_batch_and_keep_their_own_outputs():
    engine = await started(fake_model(matryoshka=True))
    try:
        first = await hold_first_batch(engine, engine.runner)
        calls = [engine.submit(call("a b", dimensions=4)), engine.submit(call("a b", "c", use_activation=False)),
                 engine.submit(call([5, 6], dimensions=2))]
        tasks = [asyncio.create_task(c) for c in calls]
        await until(lambda: engine.scheduler.queued == 4)
        engine.runner.release.set()
        short, raw, tiny = await asyncio.gather(*tasks)
        await first
        assert [len(b) for b in engine.runner.batches] == [1, 4]
        np.testing.assert_array_equal(short.outputs.values, [fake_vector(fake_ids("a b"), dimensions=4)])
        np.testing.assert_array_equal(raw.outputs.item(1), fake_vector(fake_ids("c"), normalize=False))
        assert tiny.outputs.values.shape == (1, 2)
    finally:
        await engine.stop()


async def test_the_next_batch_is_prepared_while_one_executes():
    """Under load (a full budget queued), batch N+1 is cut and prepared during batch N's execute."""
    model = fake_model(max_batch_tokens=8)
    model.runner.execute_delay = 0.03
    engine = await started(model)
    try:
        await asyncio.gather(*(engine.submit(call(f"a{i} b{i}")) for i in range(12)))  # 4 tokens each
        runner = model.runner
        assert len(runner.batches) >= 6  # 48 tokens, budget 8 (the first call may run alone)
        overlapped = [i for i in range(1, len(runner.prepare_times))
                      if runner.execute_times[i - 1][0] < runner.prepare_times[i][0] < runner.execute_times[i - 1][1]]
        assert len(overlapped) >= 4, (runner.prepare_times, runner.execute_times)
        stats = engine.load()["pipeline"]
        assert stats["batches"] == len(runner.batches) and stats["tokens"] == 48
        assert stats["prepare_overlapped_s"] > 0
    finally:
        await engine.stop()


async def test_at_low_load_the_next_batch_waits_for_the_running_one():
    """Below a full budget nothing is cut early: what queued during batch N is all in batch N+1."""
    model = fake_model(max_batch_tokens=64)
    engine = await started(model)
    try:
        first = await hold_first_batch(engine, model.runner)
        tasks = []
        for i in range(3):
            tasks.append(asyncio.create_task(engine.submit(call(f"x{i}"))))
            await until(lambda: engine.scheduler.queued == i + 1)
            await asyncio.sleep(0.01)  # the prepare thread must not cut a partial batch meanwhile
        assert engine.scheduler.queued == 3
        model.runner.release.set()
        await asyncio.gather(first, *tasks)
        assert [len(b) for b in model.runner.batches] == [1, 3]
    finally:
        await engine.stop()


async def test_a_failure_while_delivering_fails_the_batch_and_the_engine_goes_on():
    """Anything that escapes the runner's own step (here: outputs that cannot be sliced) must not kill
    the execute thread and leave calls hanging."""

    class Unsliceable:
        def __len__(self):
            return 1

    model = fake_model()
    runner = model.runner
    real_execute = runner.execute
    runner.execute = lambda batch, steps=None: [RunOutput(0, 1, Unsliceable())]
    engine = await started(model)
    try:
        with pytest.raises(InternalError, match="worker failed on a batch"):
            await asyncio.wait_for(engine.submit(call("a")), 2)
        runner.execute = real_execute
        assert (await asyncio.wait_for(engine.submit(call("b")), 2)).prompt_tokens == [3]
    finally:
        await engine.stop()
