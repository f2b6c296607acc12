"""Gateway test helpers: an app over fake worker clients, in-process or on a TCP port."""
from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.pool import WorkerPool
from poolgate.gateway.router import Router
from poolgate.shared.config import GatewayConfig
from tests.conftest import FakeRunner, FakeWorkerClient


def make_router(*clients: FakeWorkerClient, max_in_flight: int | None = None,
                ready: bool = True) -> Router:
    """One pool per distinct served model name among ``clients``."""
    by_name: dict[str, list[FakeWorkerClient]] = {}
    for client in clients:
        by_name.setdefault(client.runner.info.served_model_name, []).append(client)
    return Router(
        WorkerPool(group[0].runner.info, group, max_in_flight=max_in_flight, ready=ready)
        for group in by_name.values()
    )


@pytest.fixture
async def gateway():
    """``await gateway(config=..., router=...)`` -> a started aiohttp TestClient."""
    started: list[TestClient] = []

    async def start(*, config: GatewayConfig | None = None, router: Router | None = None) -> TestClient:
        router = router or make_router(FakeWorkerClient(FakeRunner()))
        client = TestClient(TestServer(make_app(config or GatewayConfig(), router)))
        await client.start_server()
        started.append(client)
        return client

    yield start
    for client in started:
        await client.close()


@pytest.fixture
async def live_server():
    """``await live_server(app)`` -> the base URL of ``app`` served on a real TCP port."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()
