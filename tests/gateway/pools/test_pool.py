"""WorkerPool: least-loaded pick by outstanding tokens, member states, admission, failover, drain."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

from poolgate.gateway.pools.pool import WorkerPool
from poolgate.shared.domain.errors import DeadlineExceeded, InternalError, InvalidRequest, Overloaded, Unavailable
from poolgate.shared.wire.token_call import TokenCall
from poolgate.shared.wire.messages import PoolingCall
from tests.fakes import FakeWorkerClient, expected_vector, tokenized, until


def call(text: str = "hello world", deadline: float | None = None) -> TokenCall:
    return tokenized(PoolingCall(request_id="r", model="fake-model", inputs=[text], deadline=deadline))


def two_clients() -> list[FakeWorkerClient]:
    return [FakeWorkerClient(address="fake://a"), FakeWorkerClient(address="fake://b")]


async def test_submit_returns_the_runner_vectors():
    client = FakeWorkerClient()
    pool = WorkerPool(client.info_, [client])
    result = await pool.submit(call("a b"))
    assert result.prompt_tokens == [4]
    assert result.outputs.item(0).tolist() == expected_vector("a b").tolist()
    assert pool.name == "fake-model" and pool.in_flight(client) == 0 and pool.outstanding_tokens(client) == 0


async def test_concurrent_calls_spread_to_the_least_loaded_client():
    a, b = two_clients()
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    pool = WorkerPool(a.info_, [a, b])
    tasks = [asyncio.create_task(pool.submit(call())) for _ in range(4)]
    await until(lambda: len(a.calls) + len(b.calls) == 4)
    assert (len(a.calls), len(b.calls)) == (2, 2)
    assert (pool.in_flight(a), pool.in_flight(b)) == (2, 2)
    assert pool.outstanding_tokens(a) == 2 * 4  # "hello world": 2 words between CLS and SEP, counted
    a.gate.set(), b.gate.set()
    await asyncio.gather(*tasks)
    assert (pool.in_flight(a), pool.in_flight(b)) == (0, 0)
    assert (pool.outstanding_tokens(a), pool.outstanding_tokens(b)) == (0, 0)


async def test_load_is_outstanding_tokens_not_calls():
    a, b = two_clients()
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    pool = WorkerPool(a.info_, [a, b])
    big = asyncio.create_task(pool.submit(call("word " * 400)))  # ~500 tokens on a
    await until(lambda: len(a.calls) == 1)
    small = [asyncio.create_task(pool.submit(call("hi"))) for _ in range(3)]
    await until(lambda: len(b.calls) == 3)
    assert len(a.calls) == 1  # three small calls are still less than the big one
    a.gate.set(), b.gate.set()
    await asyncio.gather(big, *small)


async def test_admission_refuses_when_every_worker_is_full():
    a, b = two_clients()
    a.gate, b.gate = asyncio.Event(), asyncio.Event()
    pool = WorkerPool(a.info_, [a, b], max_in_flight=1)
    held = [asyncio.create_task(pool.submit(call())) for _ in range(2)]
    await until(lambda: len(a.calls) + len(b.calls) == 2)
    with pytest.raises(Overloaded):
        await pool.submit(call())
    a.gate.set()
    await held[0]
    assert (await pool.submit(call())).prompt_tokens == [4]
    b.gate.set()
    await held[1]


async def test_a_lost_worker_is_marked_down_and_the_call_retried_once_elsewhere():
    a, b = two_clients()
    a.fail = Unavailable("connection lost")
    pool = WorkerPool(a.info_, [a, b])
    result = await pool.submit(call("a b"))
    assert result.outputs.item(0).tolist() == expected_vector("a b").tolist()
    assert (len(a.calls), len(b.calls)) == (1, 1)
    assert pool.state(a) == "down" and pool.is_ready(b) and pool.ready
    assert "connection lost" in pool.snapshot()[0]["error"]
    await pool.submit(call())
    assert (len(a.calls), len(b.calls)) == (1, 2)


async def test_the_retry_is_only_once():
    a, b = two_clients()
    a.fail = b.fail = Unavailable("gone")
    pool = WorkerPool(a.info_, [a, b])
    with pytest.raises(Unavailable, match="gone"):
        await pool.submit(call())
    assert (len(a.calls), len(b.calls)) == (1, 1) and not pool.ready


@pytest.mark.parametrize("error", [InvalidRequest("too long"), InternalError("device fell over")])
async def test_request_errors_are_not_retried_and_do_not_mark_the_client_unhealthy(error):
    a, b = two_clients()
    a.fail = error
    pool = WorkerPool(a.info_, [a, b])
    with pytest.raises(type(error)):
        await pool.submit(call())
    assert pool.is_ready(a) and pool.in_flight(a) == 0 and not b.calls


async def test_no_retry_once_the_deadline_has_passed():
    a, b = two_clients()
    a.gate = asyncio.Event()
    pool = WorkerPool(a.info_, [a, b])
    task = asyncio.create_task(pool.submit(call(deadline=time.time() + 0.1)))
    await until(lambda: a.calls)
    await asyncio.sleep(0.15)
    a.fail = Unavailable("lost late")
    a.gate.set()
    with pytest.raises((Unavailable, DeadlineExceeded)):
        await task
    assert not b.calls


async def test_a_hung_worker_is_taken_out_by_a_probe_and_its_calls_fail_over():
    a, b = two_clients()
    a.gate, a.health_gate = asyncio.Event(), asyncio.Event()  # alive connection, no answers
    pool = WorkerPool(a.info_, [a, b])
    task = asyncio.create_task(pool.submit(call("x y")))
    await until(lambda: a.calls)
    started = time.monotonic()
    await pool.probe(timeout_s=0.2)
    assert pool.state(a) == "down" and "no health answer" in pool.snapshot()[0]["error"]
    result = await task  # moved to b at once, not at the deadline
    assert time.monotonic() - started < 1.0 and len(b.calls) == 1
    assert result.outputs.item(0).tolist() == expected_vector("x y").tolist()
    a.health_gate.set()
    await pool.probe(timeout_s=0.2)
    assert pool.is_ready(a) and pool.recoveries(a) == 1


async def test_a_worker_that_says_it_is_draining_is_down():
    client = FakeWorkerClient()
    pool = WorkerPool(client.info_, [client])
    client.health_answer = {"ready": False, "draining": True}
    await pool.probe(timeout_s=1)
    assert pool.state(client) == "down" and "draining" in pool.snapshot()[0]["error"]


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


async def test_starting_members_take_no_calls_and_are_not_probed():
    a, b = two_clients()
    pool = WorkerPool(a.info_, [a, b])
    pool.set_state(a, "starting", "restarting after exit code -9")
    await pool.probe()
    assert pool.state(a) == "starting"
    for _ in range(3):
        await pool.submit(call())
    assert not a.calls and len(b.calls) == 3


async def test_replace_puts_a_restarted_worker_in_the_same_slot():
    a, b = two_clients()
    pool = WorkerPool(a.info_, [a, b])
    pool.set_state(a, "starting")
    a2 = FakeWorkerClient(address="fake://a")
    pool.replace(a, a2)
    assert pool.clients == [a2, b] and pool.is_ready(a2) and pool.recoveries(a2) == 1
    await pool.submit(call())
    await pool.submit(call())
    assert len(a2.calls) == 1


async def test_add_and_remove_with_drain():
    a, b = two_clients()
    pool = WorkerPool(a.info_, [a])
    pool.add(b)
    assert pool.clients == [a, b]
    with pytest.raises(ValueError):
        pool.add(b)
    a.gate = asyncio.Event()
    held = asyncio.create_task(pool.submit(call()))
    await until(lambda: a.calls)
    removing = asyncio.create_task(pool.remove(a))
    await until(lambda: pool.state(a) == "draining")
    await pool.submit(call())  # goes to b: a takes no new calls while it drains
    assert len(a.calls) == 1 and len(b.calls) == 1 and not removing.done()
    a.gate.set()
    await held
    await removing
    assert pool.clients == [b] and a.closed


async def _one_call_held():
    """A one-worker pool and a call in flight that its worker holds until ``client.gate`` is set."""
    client = FakeWorkerClient()
    client.gate = asyncio.Event()
    pool = WorkerPool(client.info_, [client])
    held = asyncio.create_task(pool.submit(call()))
    await until(lambda: client.calls)
    return client, pool, held


async def test_remove_gives_up_waiting_after_the_drain_timeout():
    client, pool, held = await _one_call_held()
    await pool.remove(client, drain_timeout_s=0.05)
    assert pool.clients == [] and client.closed
    held.cancel()


async def test_snapshot_lists_state_and_load():
    a, b = two_clients()
    a.gate = asyncio.Event()
    pool = WorkerPool(a.info_, [a, b])
    pool.set_state(b, "down", "connection refused")
    held = asyncio.create_task(pool.submit(call("x" * 40)))  # one word: 3 tokens counted
    await until(lambda: a.calls)
    assert pool.snapshot() == [
        {"address": "fake://a", "state": "ready", "calls_in_flight": 1, "outstanding_tokens": 3,
         "recoveries": 0, "error": None, "tokens_per_s": 0.0},
        {"address": "fake://b", "state": "down", "calls_in_flight": 0, "outstanding_tokens": 0,
         "recoveries": 0, "error": "connection refused", "tokens_per_s": 0.0},
    ]
    a.gate.set()
    await held


async def test_drain_refuses_new_calls_and_idle_waits_for_the_rest():
    client, pool, held = await _one_call_held()
    pool.drain()
    assert not pool.ready
    with pytest.raises(Unavailable, match="shutting down"):
        await pool.submit(call())
    idle = asyncio.create_task(pool.idle())
    await asyncio.sleep(0.01)
    assert not idle.done()
    client.gate.set()
    await held
    await asyncio.wait_for(idle, 1)


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
    client = FakeWorkerClient()
    client.gate = asyncio.Event()  # never set: the worker does not answer
    pool = WorkerPool(client.info_, [client])
    late = tokenized(PoolingCall(request_id="slow", model="fake-model", inputs=["x"], deadline=time.time() + 0.05))
    with pytest.raises(DeadlineExceeded, match="slow"):
        await pool.submit(late)
    assert pool.in_flight(client) == 0 and pool.is_ready(client)


async def test_a_busy_worker_that_answers_calls_is_not_taken_out_by_a_slow_health_check():
    a, b = two_clients()
    a.health_gate = asyncio.Event()  # its checks are slow...
    pool = WorkerPool(a.info_, [a, b])
    probing = asyncio.create_task(pool.probe(timeout_s=0.2))
    await asyncio.sleep(0.05)
    await pool.submit(call())  # ...but it answers calls meanwhile
    await pool.submit(call())
    await probing
    assert pool.is_ready(a) and len(a.calls) == 1
    await pool.probe(timeout_s=0.05)  # nothing answered during this one: down
    assert pool.state(a) == "down"


async def test_a_pool_without_ready_workers_says_so_once_and_once_when_it_serves_again(caplog):
    a, b = two_clients()
    pool = WorkerPool(a.info_, [a, b], ready=False)
    with caplog.at_level(logging.INFO, logger="poolgate.gateway.pools.pool"):
        pool.mark_ready(a)
        pool.mark_ready(b)  # starting up: no "serving again"
        pool.mark_ready(a, False)
        pool.mark_ready(b, False)
        for _ in range(100):
            with pytest.raises(Unavailable):
                await pool.submit(call())
            pool.mark_ready(b, False)
        pool.mark_ready(a)
        pool.mark_ready(b)
    lines = [r.getMessage() for r in caplog.records if "pool 'fake-model'" in r.getMessage()]
    assert lines == ["pool 'fake-model' has no ready worker: its requests get 503 until one is back",
                     "pool 'fake-model' is serving again (1 ready)"]
