"""WorkerPool: least-loaded pick, readiness flags, admission, failure marking."""
from __future__ import annotations

import asyncio

import pytest

from poolgate.gateway.pool import WorkerPool
from poolgate.shared.errors import InvalidRequest, Overloaded, Unavailable
from poolgate.shared.wire import PoolingCall
from tests.fakes import FakeWorkerClient, expected_vector


def call(text: str = "hello world") -> PoolingCall:
    return PoolingCall(request_id="r", model="fake-model", inputs=[text])


def two_clients() -> list[FakeWorkerClient]:
    return [FakeWorkerClient(address="fake://a"), FakeWorkerClient(address="fake://b")]


async def test_submit_returns_the_runner_vectors():
    client = FakeWorkerClient()
    pool = WorkerPool(client.info_, [client])
    result = await pool.submit(call("a b"))
    assert result.prompt_tokens == [4]
    assert result.outputs.item(0).tolist() == expected_vector("a b").tolist()
    assert pool.name == "fake-model" and pool.in_flight(client) == 0


async def test_concurrent_calls_spread_to_the_least_loaded_client():
    a, b = two_clients()
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    pool = WorkerPool(a.info_, [a, b])
    tasks = [asyncio.create_task(pool.submit(call())) for _ in range(4)]
    await asyncio.sleep(0)
    assert (len(a.calls), len(b.calls)) == (2, 2)
    assert (pool.in_flight(a), pool.in_flight(b)) == (2, 2)
    a.gate.set(), b.gate.set()
    await asyncio.gather(*tasks)
    assert (pool.in_flight(a), pool.in_flight(b)) == (0, 0)


async def test_admission_refuses_when_every_worker_is_full():
    a, b = two_clients()
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    pool = WorkerPool(a.info_, [a, b], max_in_flight=1)
    held = [asyncio.create_task(pool.submit(call())) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):
        await pool.submit(call())
    a.gate.set()
    await held[0]
    assert (await pool.submit(call())).prompt_tokens == [4]
    b.gate.set()
    await held[1]


async def test_unavailable_marks_the_client_not_ready_and_traffic_moves():
    a, b = two_clients()
    a.fail = Unavailable("connection lost")
    pool = WorkerPool(a.info_, [a, b])
    with pytest.raises(Unavailable):
        await pool.submit(call())
    assert not pool.is_ready(a) and pool.is_ready(b) and pool.ready
    await pool.submit(call())
    assert len(b.calls) == 1 and len(a.calls) == 1


async def test_request_errors_do_not_mark_the_client_unhealthy():
    client = FakeWorkerClient()
    client.fail = InvalidRequest("too long")
    pool = WorkerPool(client.info_, [client])
    with pytest.raises(InvalidRequest):
        await pool.submit(call())
    assert pool.is_ready(client) and pool.in_flight(client) == 0


async def test_no_ready_worker_is_unavailable_until_marked_or_probed():
    a, b = two_clients()
    pool = WorkerPool(a.info_, [a, b], ready=False)
    assert not pool.ready
    with pytest.raises(Unavailable, match="No worker is ready"):
        await pool.submit(call())
    pool.mark_ready(a)
    assert pool.ready and pool.is_ready(a) and not pool.is_ready(b)
    b.fail = Unavailable("down")
    await pool.probe()
    assert pool.is_ready(a) and not pool.is_ready(b)
    b.fail = None
    await pool.probe()
    assert pool.is_ready(b)


async def test_close_closes_every_client():
    a, b = two_clients()
    await WorkerPool(a.info_, [a, b]).close()
    assert a.closed and b.closed


@pytest.mark.parametrize("kwargs", [{"clients": []}, {"max_in_flight": 0}])
def test_bad_construction_is_refused(kwargs):
    client = FakeWorkerClient()
    args = {"clients": [client], **kwargs}
    with pytest.raises(ValueError):
        WorkerPool(client.info_, args.pop("clients"), **args)


async def test_a_wedged_worker_answers_504_at_the_deadline_and_stays_in_rotation():
    import time

    from poolgate.shared.errors import DeadlineExceeded

    client = FakeWorkerClient()
    client.gate = asyncio.Event()  # never set: the worker does not answer
    pool = WorkerPool(client.info_, [client])
    late = PoolingCall(request_id="slow", model="fake-model", inputs=["x"], deadline=time.time() + 0.05)
    with pytest.raises(DeadlineExceeded, match="slow"):
        await pool.submit(late)
    assert pool.in_flight(client) == 0 and pool.is_ready(client)
