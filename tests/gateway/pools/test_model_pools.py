"""ModelPools: the first pool that can take a call takes it; the next pools are its overflow."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from poolgate.gateway.pools.model_pools import ModelPools
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.shared.domain.errors import Overloaded, Unavailable
from poolgate.shared.wire.token_call import TokenCall
from poolgate.shared.wire.messages import PoolingCall
from tests.fakes import FakeWorkerClient, fake_model, tokenized, until


def pool(backend: str, n: int = 1, *, cap: int | None = None) -> WorkerPool:
    info = dataclasses.replace(fake_model(name="m").info, backend=backend)
    return WorkerPool(info, [FakeWorkerClient(info, address=f"{backend}-{i}") for i in range(n)], max_in_flight=cap)


def call(i: int = 0) -> TokenCall:
    return tokenized(PoolingCall(request_id=f"r{i}", model="m", inputs=["a b"]))


async def test_the_first_pool_takes_everything_it_can():
    cuda, cpu = pool("cuda", 2), pool("cpu")
    model = ModelPools([cuda, cpu])
    for i in range(6):
        await model.submit(call(i))
    assert sum(len(c.calls) for c in cuda.clients) == 6 and not cpu.clients[0].calls


async def test_calls_overflow_to_the_next_pool_when_the_first_is_at_its_cap():
    cuda, cpu = pool("cuda", cap=1), pool("cpu", cap=1)
    for c in (*cuda.clients, *cpu.clients):
        c.gate = asyncio.Event()
    model = ModelPools([cuda, cpu])
    first = asyncio.create_task(model.submit(call(1)))
    await until(lambda: cuda.in_flight(cuda.clients[0]) == 1)
    second = asyncio.create_task(model.submit(call(2)))
    await until(lambda: cpu.in_flight(cpu.clients[0]) == 1)
    with pytest.raises(Overloaded):  # every pool full: the client sees the 429
        await model.submit(call(3))
    for c in (*cuda.clients, *cpu.clients):
        c.gate.set()
    await asyncio.gather(first, second)
    assert [x.request_id for x in cuda.clients[0].calls] == ["r1"]
    assert [x.request_id for x in cpu.clients[0].calls] == ["r2"]


async def test_a_pool_without_a_ready_worker_is_skipped_and_a_lost_one_fails_over():
    cuda, cpu = pool("cuda"), pool("cpu")
    model = ModelPools([cuda, cpu])
    cuda.mark_ready(cuda.clients[0], False)
    await model.submit(call(1))
    assert len(cpu.clients[0].calls) == 1 and model.ready
    cuda.mark_ready(cuda.clients[0])
    cuda.clients[0].fail = Unavailable("connection lost")
    await model.submit(call(2))  # sent to cuda, lost there, served by cpu
    assert [x.request_id for x in cpu.clients[0].calls] == ["r1", "r2"]
    cpu.clients[0].fail = Unavailable("gone too")
    with pytest.raises(Unavailable):
        await model.submit(call(3))
    assert not model.ready


async def test_the_per_worker_view_spans_every_pool():
    cuda, cpu = pool("cuda", 2), pool("cpu")
    model = ModelPools([cuda, cpu])
    assert model.clients == [*cuda.clients, *cpu.clients] and model.backends == ["cuda", "cpu"]
    last = cpu.clients[0]
    model.mark_ready(last, False)
    assert not model.is_ready(last) and model.pool_of(last) is cpu and model.in_flight(last) == 0
    await model.probe(0.5)
    assert model.is_ready(last) and model.recoveries(last) == 1
    snap = model.snapshot()
    assert [p["backend"] for p in snap] == ["cuda", "cpu"] and len(snap[0]["workers"]) == 2
    assert snap[1]["workers"][0]["address"] == "cpu-0" and snap[1]["workers"][0]["state"] == "ready"
    model.drain()
    assert not model.ready
    await model.close()
    assert all(c.closed for c in model.clients)


def test_pools_of_one_model_must_agree():
    other = WorkerPool(dataclasses.replace(fake_model(name="m", dim=16).info, backend="cpu"), [FakeWorkerClient()])
    with pytest.raises(ValueError, match="differs from its cuda pool in embedding_dim"):
        ModelPools([pool("cuda"), other])
    with pytest.raises(ValueError, match="added to model 'm'"):
        ModelPools([pool("cuda"), WorkerPool(fake_model(name="x").info, [FakeWorkerClient()])])
    with pytest.raises(ValueError, match="at least one pool"):
        ModelPools([])


async def test_the_refusal_a_client_sees():
    cuda, cpu = pool("cuda", cap=1), pool("cpu")
    model = ModelPools([cuda, cpu])
    cuda.clients[0].gate = asyncio.Event()
    held = asyncio.create_task(model.submit(call(1)))
    await until(lambda: cuda.in_flight(cuda.clients[0]) == 1)
    cpu.mark_ready(cpu.clients[0], False)
    with pytest.raises(Overloaded):  # the first pool is only full: 429, worth retrying shortly
        await model.submit(call(2))
    cuda.clients[0].gate.set()
    await held
    model.drain()
    with pytest.raises(Unavailable, match="shutting down"):
        await model.submit(call(3))
