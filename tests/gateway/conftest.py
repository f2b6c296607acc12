"""Gateway test helpers: the real app over real workers (transport + Engine around a FakeRunner)."""
from __future__ import annotations

import contextlib
import tempfile

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.inputs.front import Front
from poolgate.workers.engine.runner_api import LoadedModel
from tests.fakes import fake_model, worker_clients


@contextlib.asynccontextmanager
async def served_router(models: list[LoadedModel], *, max_in_flight: int | None = None, ready: bool = True):
    """A Router with one pool per served name, each model served by a real worker on a Unix socket."""
    with tempfile.TemporaryDirectory(prefix="pg-test-") as folder:
        async with worker_clients(models, folder) as clients:
            by_name: dict[str, tuple] = {}
            for model, client in zip(models, clients):
                by_name.setdefault(model.info.served_model_name, (model, []))[1].append(client)
            yield Router(WorkerPool(model.info, members, max_in_flight=max_in_flight, ready=ready,
                                    front=Front(model.info, model.encoder))
                         for model, members in by_name.values())


@pytest.fixture
async def gateway():
    """``await gateway(config=..., models=[...], max_in_flight=..., ready=...)`` -> a started TestClient.

    ``models`` defaults to one ``fake_model()``; every model gets a real worker."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(*, config: GatewayConfig | None = None, models: list[LoadedModel] | None = None,
                        max_in_flight: int | None = None, ready: bool = True) -> TestClient:
            router = await stack.enter_async_context(
                served_router(models or [fake_model()], max_in_flight=max_in_flight, ready=ready))
            client = TestClient(TestServer(make_app(config or GatewayConfig(), router)))
            await client.start_server()
            stack.push_async_callback(client.close)
            return client

        yield start


@pytest.fixture
async def live_server():
    """``await live_server(app, unix=None)`` -> the base URL of ``app`` served on a real TCP port (and on the unix
    socket ``unix`` too: the Batch API runner's own site)."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application, unix: str | None = None) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        if unix is not None:
            await web.UnixSite(runner, unix).start()
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()
