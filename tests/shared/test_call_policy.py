"""A call's priority and deadline cross the transport to each worker Sequence; a full worker queue is Overloaded."""
from __future__ import annotations

import json

import asyncio
import time

import pytest

from poolgate.shared.domain.errors import Overloaded, from_wire
from poolgate.shared.wire.transport import WorkerClient
from poolgate.shared.wire.token_call import TokenCall
from poolgate.shared.wire.messages import PoolingCall, TextPair
from poolgate.workers.engine.engine import Engine
from poolgate.workers.server import bound_address, serve
from tests.fakes import fake_model, tokenized


def test_priority_and_deadline_survive_the_wire():
    call = tokenized(PoolingCall(request_id="r", model="m", inputs=["a"], deadline=123.5, priority=-3))
    header, arrays = call.to_wire()
    back = TokenCall.from_wire(json.loads(json.dumps(header)), arrays)
    assert (back.deadline, back.priority, back.sequences()) == (123.5, -3, call.sequences())


def test_overloaded_keeps_its_class_and_429_across_the_wire():
    error = from_wire(Overloaded("queue is full").to_wire())
    assert type(error) is Overloaded and error.status == 429 and error.message == "queue is full"


@pytest.fixture
async def served():
    model = fake_model(max_batch_tokens=64)
    engine = Engine(model, max_queued_tokens=3)
    await engine.start()
    server = await serve("tcp://127.0.0.1:0", engine, model.info)
    client = await WorkerClient.connect(bound_address(server))
    yield model, client
    model.runner.release.set()
    await client.close()
    server.close()
    await engine.stop()


async def test_a_calls_priority_and_deadline_reach_every_sequence(served):
    model, client = served
    deadline = time.time() + 30
    await client.pool(tokenized(PoolingCall(request_id="r", model="fake-model", inputs=[[1, 2], [3]], deadline=deadline,
                                  priority=9)))
    assert [(s.priority, s.deadline) for s in model.runner.batches[-1]] == [(9, deadline), (9, deadline)]


async def test_a_full_worker_queue_answers_overloaded(served):
    model, client = served
    model.runner.release.clear()
    held = asyncio.create_task(client.pool(tokenized(PoolingCall(request_id="a", model="fake-model", inputs=[[1]]))))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    queued = asyncio.create_task(client.pool(tokenized(PoolingCall(request_id="b", model="fake-model", inputs=[[2, 3]]))))
    await asyncio.sleep(0.05)
    with pytest.raises(Overloaded, match="queue is full"):
        await client.pool(tokenized(PoolingCall(request_id="c", model="fake-model", inputs=[[4, 5]])))
    model.runner.release.set()
    await asyncio.gather(held, queued)
