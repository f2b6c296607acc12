"""The whole gateway over HTTP (Lifecycle, Fleet, pools, supervisors, health checks) with real worker processes
(fake runner): traffic keeps flowing, with no failed request, while a worker is SIGKILLed and restarted."""
from __future__ import annotations

import asyncio
import base64
import logging
import os
import signal

from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.launch import Lifecycle
from poolgate.gateway.pools.router import Router
from poolgate.shared.config.frozen import GatewayConfig, PoolConfig, WorkerConfig
from tests.fakes import expected_vector, until
from tests.processes import alive

CFG = WorkerConfig(model="unused", served_model_name="fo-model", backend="cpu", max_model_len=16)


async def test_no_request_fails_while_a_worker_is_killed_and_restarted(caplog):
    caplog.set_level(logging.INFO, "poolgate")
    config = GatewayConfig(pools=(PoolConfig(model="fo-model", backend="cpu", workers=(CFG, CFG)),))
    lifecycle = Lifecycle(config, Router(), runner_factory="tests.workers.fake_factory:paced")
    client = TestClient(TestServer(make_app(config, lifecycle.router, cleanup_ctx=[lifecycle.workers])))
    await client.start_server()
    statuses: list[int] = []
    stop = asyncio.Event()

    async def load(k: int) -> None:
        while not stop.is_set():
            resp = await client.post("/v1/embeddings", json={"input": [f"text {k}"], "encoding_format": "base64"})
            body = await resp.json()
            statuses.append(resp.status)
            if resp.status == 200:
                assert base64.b64decode(body["data"][0]["embedding"]) == expected_vector(f"text {k}").tobytes()

    try:
        lifecycle.site_listening("")
        await until(lambda: lifecycle.router.ready, 30)
        sups = lifecycle.fleet.running["fo-model"][0].supervisors
        model = lifecycle.router.pools["fo-model"]
        loads = [asyncio.create_task(load(k)) for k in range(6)]
        await until(lambda: len(statuses) >= 30 and model.in_flight(sups[0].member) > 0, 20)
        victim = sups[0].worker.pid
        os.kill(victim, signal.SIGKILL)
        await until(lambda: sups[0].restarts == 1 and all(model.is_ready(c) for c in model.clients), 30)
        done = len(statuses)
        await until(lambda: len(statuses) >= done + 30, 20)
        stop.set()
        await asyncio.gather(*loads)
    finally:
        stop.set()
        await client.close()
    assert not alive(victim)
    assert "retrying" in caplog.text  # calls were in flight on the killed worker, and moved
    assert set(statuses) == {200}, f"{len(statuses) - statuses.count(200)} of {len(statuses)} requests failed"
    assert not any(alive(s.worker.pid) for s in sups if s.worker is not None)
