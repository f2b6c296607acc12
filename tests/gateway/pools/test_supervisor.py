"""Local workers as real processes (fake runner): reported addresses, restart with backoff, partial start-up,
worker drain on SIGTERM."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import pytest

from poolgate.gateway.pools.local_worker import LocalWorker
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.supervisor import Backoff, Supervisor, start_all
from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.errors import Unavailable
from poolgate.shared.wire.token_call import TokenCall
from poolgate.shared.wire.messages import PoolingCall
from tests.fakes import expected_vector, tokenized, until
from tests.processes import alive

FACTORY = "tests.workers.fake_factory:build"
CFG = WorkerConfig(model="unused", served_model_name="sup-model", max_model_len=16)
FAST = Backoff(first_s=0.05, max_s=0.2, reset_after_s=60)


def call(text: str = "hello there") -> TokenCall:
    return tokenized(PoolingCall(request_id="r", model="sup-model", inputs=[text]))


def test_backoff_doubles_up_to_its_cap():
    b = Backoff(first_s=0.5, max_s=30)
    assert [b.delay(n) for n in (1, 2, 3, 4, 7, 8, 20)] == [0.5, 1, 2, 4, 30, 30, 30]


async def test_a_tcp_worker_binds_its_own_port_and_reports_it():
    worker = LocalWorker()
    await worker.start(CFG, "tcp://127.0.0.1:0", ready_timeout=30, runner_factory=FACTORY)
    try:
        assert worker.address.startswith("tcp://127.0.0.1:") and not worker.address.endswith(":0")
        assert worker.client.address == worker.address
        result = await worker.client.pool(call())
        assert result.outputs.item(0).tobytes() == expected_vector("hello there").tobytes()
    finally:
        assert await worker.stop(timeout=5) == 0


async def test_the_worker_gets_the_extra_environment(tmp_path):
    worker = LocalWorker({"POOLGATE_TEST_NAME": "from-env"})
    await worker.start(CFG, f"unix:{tmp_path}/w.sock", ready_timeout=30,
                       runner_factory="tests.workers.fake_factory:from_env")
    try:
        assert worker.info.served_model_name == "from-env"
    finally:
        await worker.stop(timeout=5)


async def test_a_killed_worker_is_restarted_and_takes_its_place_again(tmp_path, caplog):
    caplog.set_level(logging.INFO, "poolgate")
    sups = [Supervisor(CFG, f"unix:{tmp_path}/w{i}.sock", i, ready_timeout=30, backoff=FAST,
                       runner_factory=FACTORY) for i in range(2)]
    await start_all(sups)
    pool = WorkerPool(sups[0].worker.info, [s.worker.client for s in sups])
    for sup in sups:
        sup.attach(pool)
    runs = [asyncio.create_task(s.run()) for s in sups]
    try:
        victim, first = sups[0], sups[0].worker.pid
        os.kill(first, signal.SIGKILL)
        await until(lambda: pool.snapshot()[0]["state"] == "starting", 5)
        assert "exited with code -9" in pool.snapshot()[0]["error"]
        for _ in range(4):  # served by the other replica meanwhile
            await pool.submit(call())
        await until(lambda: pool.snapshot()[0]["state"] == "ready", 30)
        assert victim.worker.pid != first and victim.restarts == 1 and not alive(first)
        assert pool.clients[0] is victim.worker.client and pool.recoveries(pool.clients[0]) == 1
        assert (await pool.submit(call("a b"))).outputs.item(0).tobytes() == expected_vector("a b").tobytes()
        assert "restarting in 0.05s" in caplog.text
    finally:
        for sup in sups:
            await sup.stop()
        await asyncio.gather(*runs, return_exceptions=True)
        await pool.close()
    assert not any(alive(s.worker.pid) for s in sups)


async def test_one_worker_failing_at_start_serves_with_the_rest_and_retries(tmp_path, caplog):
    good = Supervisor(CFG, f"unix:{tmp_path}/a.sock", 0, ready_timeout=30, backoff=FAST, runner_factory=FACTORY)
    bad = Supervisor(CFG, f"unix:{tmp_path}/b.sock", 1, ready_timeout=30, backoff=FAST,
                     runner_factory="tests.workers.fake_factory:fail")
    await start_all([good, bad])
    assert good.worker is not None and bad.worker is None and bad.failures == 1
    assert "worker 1 of sup-model failed to start: worker process exited with code 1" in caplog.text
    pool = WorkerPool(good.worker.info, [good.worker.client])
    good.attach(pool), bad.attach(pool)
    bad.runner_factory = FACTORY  # whatever was wrong is fixed: the background retry brings it in
    runs = [asyncio.create_task(s.run()) for s in (good, bad)]
    try:
        await until(lambda: len(pool.clients) == 2, 30)
        assert pool.is_ready(pool.clients[1]) and pool.clients[1] is bad.worker.client
    finally:
        for sup in (good, bad):
            await sup.stop()
        await asyncio.gather(*runs, return_exceptions=True)
        await pool.close()


async def test_start_all_records_why_each_worker_failed(tmp_path):
    bad = [Supervisor(CFG, f"unix:{tmp_path}/{i}.sock", i, ready_timeout=30,
                      runner_factory="tests.workers.fake_factory:fail") for i in range(2)]
    await start_all(bad)
    assert [s.worker for s in bad] == [None, None]
    assert all("exited with code 1 before it was ready" in s.error for s in bad)


async def test_a_worker_drains_on_sigterm(tmp_path):
    """Calls in flight finish; a call that arrives while it drains is refused as Unavailable."""
    worker = LocalWorker()
    await worker.start(CFG, f"unix:{tmp_path}/w.sock", ready_timeout=30, runner_factory="tests.workers.fake_factory:slow")
    try:
        held = asyncio.create_task(worker.client.pool(call("in flight")))
        await asyncio.sleep(0.2)  # it is on the "device" now (each batch takes 0.5 s)
        worker.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.05)
        with pytest.raises(Unavailable, match="draining"):
            await worker.client.pool(call("late"))
        assert (await worker.client.health())["draining"] is True
        result = await held
        assert result.outputs.item(0).tobytes() == expected_vector("in flight").tobytes()
        assert await asyncio.wait_for(worker.process.wait(), 10) == 0
    finally:
        await worker.stop(timeout=5)


async def test_a_worker_with_a_token_is_reached_by_its_gateway(tmp_path):
    from dataclasses import replace

    from poolgate.shared.config.frozen import TransportSecurity

    worker = LocalWorker()
    cfg = replace(CFG, security=TransportSecurity(token="s3cret-t0ken"))
    await worker.start(cfg, "tcp://127.0.0.1:0", ready_timeout=30, runner_factory=FACTORY)
    try:
        assert (await worker.client.health())["ready"] is True
        from poolgate.shared.wire.transport import WorkerClient

        with pytest.raises(Unavailable, match="token"):
            stranger = await WorkerClient.connect(worker.address)
            await stranger.info()
    finally:
        await worker.stop(timeout=5)


async def test_no_call_fails_while_a_worker_is_killed_under_load(tmp_path, caplog):
    """Real processes: two supervised workers under steady load, one SIGKILLed mid-run; every call succeeds
    (the ones in flight on it are retried on the other) and the killed one rejoins."""
    sups = [Supervisor(CFG, f"unix:{tmp_path}/w{i}.sock", i, ready_timeout=30, backoff=FAST,
                       runner_factory="tests.workers.fake_factory:paced") for i in range(2)]
    await start_all(sups)
    pool = WorkerPool(sups[0].worker.info, [s.worker.client for s in sups])
    for sup in sups:
        sup.attach(pool)
    caplog.set_level(logging.INFO, "poolgate")
    runs = [asyncio.create_task(s.run()) for s in sups]
    done, failed, stop = [0], [], asyncio.Event()

    async def client(k: int) -> None:
        while not stop.is_set():
            try:
                result = await pool.submit(call(f"text {k}"))
                assert result.outputs.item(0).tobytes() == expected_vector(f"text {k}").tobytes()
                done[0] += 1
            except Exception as exc:  # counted, not raised: the test reports every failure
                failed.append(repr(exc))

    load = [asyncio.create_task(client(k)) for k in range(8)]
    try:
        await until(lambda: done[0] >= 20 and pool.in_flight(pool.clients[0]) > 0, 10)
        os.kill(sups[0].worker.pid, signal.SIGKILL)
        await until(lambda: sups[0].restarts == 1 and pool.is_ready(pool.clients[0]), 30)
        before = done[0]
        await until(lambda: done[0] >= before + 20, 10)
    finally:
        stop.set()
        await asyncio.gather(*load)
        for sup in sups:
            await sup.stop()
        await asyncio.gather(*runs, return_exceptions=True)
        await pool.close()
    assert failed == []
    assert pool.recoveries(pool.clients[0]) == 1
    assert "retrying r on unix:" in caplog.text  # the calls in flight on the killed worker moved


async def test_a_worker_without_a_token_gets_a_random_one():
    from poolgate.shared.wire.transport import WorkerClient

    worker = LocalWorker()
    await worker.start(CFG, "tcp://127.0.0.1:0", ready_timeout=30, runner_factory=FACTORY)
    try:
        assert (await worker.client.info()).served_model_name == "sup-model"
        with pytest.raises(Unavailable, match="token"):
            stranger = await WorkerClient.connect(worker.address)
            await stranger.info()
    finally:
        await worker.stop(timeout=5)


async def test_a_hung_worker_is_taken_out_then_killed_and_restarted(tmp_path):
    """SIGSTOP: the connection stays open but nothing answers. Health checks take it out within a second;
    after ``hung_kill_after_s`` down, the supervisor kills it and a fresh one takes its place."""
    from poolgate.gateway.pools import health
    from poolgate.gateway.pools.router import Router

    sups = [Supervisor(CFG, f"unix:{tmp_path}/w{i}.sock", i, ready_timeout=30, backoff=FAST,
                       runner_factory=FACTORY, hung_kill_after_s=1.0) for i in range(2)]
    await start_all(sups)
    pool = WorkerPool(sups[0].worker.info, [s.worker.client for s in sups])
    for sup in sups:
        sup.attach(pool)
    tasks = [asyncio.create_task(s.run()) for s in sups]
    tasks.append(asyncio.create_task(health.watch(Router([pool]), 0.1, 0.4)))
    hung = sups[0].worker.pid
    try:
        os.kill(hung, signal.SIGSTOP)
        stopped = time.monotonic()
        await until(lambda: pool.state(pool.clients[0]) == "down", 5)
        assert time.monotonic() - stopped < 1.0
        assert "no health answer" in pool.snapshot()[0]["error"]
        await until(lambda: sups[0].restarts == 1 and pool.is_ready(pool.clients[0]), 30)
        assert sups[0].worker.pid != hung and not alive(hung)
        assert (await pool.submit(call("a b"))).outputs.item(0).tobytes() == expected_vector("a b").tobytes()
    finally:
        for task in tasks:
            task.cancel()
        for sup in sups:
            await sup.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pool.close()


async def test_a_pool_serves_with_the_workers_that_came_up_and_the_other_joins_later(tmp_path, caplog):
    """Through gateway.pools.fleet, as `poolgate serve --workers 2` runs it: one worker fails to start; the model is
    served by the other at once, the log says so, and the failed one is retried in the background and joins."""
    from poolgate.gateway.pools.fleet import Fleet
    from poolgate.gateway.pools.router import Router
    from poolgate.shared.config.frozen import GatewayConfig, PoolConfig

    cfg = WorkerConfig(model=str(tmp_path), served_model_name="sup-model", backend="cpu")
    config = GatewayConfig(pools=(PoolConfig(model="sup-model", backend="cpu", workers=(cfg, cfg)),))
    router = Router()
    folder = tmp_path / "sockets"
    folder.mkdir(mode=0o700)
    fleet = Fleet(config, router, folder, runner_factory="tests.workers.fake_factory:fail_once")
    try:
        await fleet.start(config.pools)
        model = router.pools["sup-model"]
        assert len(model.clients) == 1 and model.ready
        assert "failed to start: worker process exited with code 1" in caplog.text
        assert "with 1 of 2 local workers; the others keep retrying in the background" in caplog.text
        assert (await model.submit(call("a b"))).outputs.item(0).tobytes() == expected_vector("a b").tobytes()
        await until(lambda: len(model.clients) == 2 and all(model.is_ready(c) for c in model.clients), 30)
    finally:
        await fleet.stop()
        await router.close()
