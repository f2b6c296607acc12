"""Device out-of-memory: a batch that runs out of memory is split and retried; only an input that cannot fit
alone fails (400); the worker goes on, says so once in the log and counts it."""
from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.engine import Engine
from poolgate.workers.engine.oom import is_out_of_memory, run_in_halves
from poolgate.workers.engine.sequence import Sequence
from tests.fakes import FakeRunner, OutOfMemoryRunner, fake_model, fake_vector

torch = pytest.importorskip("torch")


def call(*inputs) -> PoolingCall:
    return PoolingCall(request_id="r", model="fake-model", inputs=list(inputs))


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_out_of_memory_is_known_by_its_class():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("CUDA out of memory"))  # only the typed error is retried


def test_halves_keep_the_batchs_offsets_and_name_what_cannot_fit_alone():
    runner = OutOfMemoryRunner(max_tokens=6)
    seqs = [Sequence(ids(10 * i, n), PoolingParams()) for i, n in enumerate([3, 3, 8, 2, 2, 2])]
    split = run_in_halves(runner, seqs)
    assert split.too_big == [2]
    covered = sorted(i for run in split.outputs for i in range(run.start, run.stop))
    assert covered == [0, 1, 3, 4, 5]
    for run in split.outputs:
        for j, i in enumerate(range(run.start, run.stop)):
            np.testing.assert_array_equal(run.rows.item(j), fake_vector(seqs[i].token_ids))


def test_errors_other_than_out_of_memory_propagate():
    class Broken(FakeRunner):
        def execute(self, batch, steps=None):
            raise ValueError("not a memory problem")

    with pytest.raises(ValueError):
        run_in_halves(Broken(), [Sequence([1], PoolingParams()), Sequence([2], PoolingParams())])


async def test_only_the_input_that_cannot_fit_alone_fails_and_the_worker_goes_on(caplog):
    runner = OutOfMemoryRunner(max_tokens=10)
    model = fake_model(max_batch_tokens=64, max_model_len=32, runner=runner)
    engine = Engine(model)
    await engine.start()
    try:
        runner.release.clear()
        held = asyncio.create_task(engine.submit(call([1])))
        await asyncio.to_thread(runner.entered.wait, 2)
        small = asyncio.create_task(engine.submit(call(*[ids(100 + 10 * i, 3) for i in range(8)])))  # 24 tokens
        big = asyncio.create_task(engine.submit(call(ids(500, 12))))  # 12 tokens: over the device alone
        await asyncio.sleep(0.05)
        with caplog.at_level(logging.DEBUG, logger="poolgate.worker.engine"):
            runner.release.set()
            await held
            result = await small
            with pytest.raises(InvalidRequest, match="does not fit in the device's memory, even alone"):
                await big
            again = await engine.submit(call(*[ids(700 + 10 * i, 4) for i in range(5)]))  # 20 tokens: split too
        for i in range(8):
            np.testing.assert_array_equal(result.outputs.item(i), fake_vector(ids(100 + 10 * i, 3)))
        assert again.prompt_tokens == [4] * 5 and runner.refused
        assert engine.load()["pipeline"]["out_of_memory"] == 2
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "out of memory" in r.message]
        assert len(warnings) == 1  # said once; the second is counted
        assert (await engine.submit(call([3, 4]))).prompt_tokens == [2]
    finally:
        await engine.stop()
