"""The telemetry tests' fixtures: an app with a recorder that keeps every finished record, one that records metrics."""
from __future__ import annotations

import contextlib

import pytest
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.telemetry.metrics import GatewayMetrics
from poolgate.gateway.telemetry.record import Telemetry
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import fake_model
from tests.gateway.conftest import served_router


class Records:
    """A metrics recorder that keeps every finished record."""

    def __init__(self):
        self.records = []

    def observe(self, record) -> None:
        self.records.append(record)


@pytest.fixture
async def recorded():
    """``await recorded(model)`` -> (client, Records) for an app serving ``model`` with telemetry on."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(model):
            records = Records()
            router = await stack.enter_async_context(served_router([model]))
            client = TestClient(TestServer(make_app(GatewayConfig(), router, telemetry=Telemetry(recorder=records))))
            await client.start_server()
            stack.push_async_callback(client.close)
            return client, records

        yield start


@pytest.fixture
async def scraped():
    """``await scraped(models=..., max_in_flight=...)`` -> a TestClient whose app records metrics."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(models=None, max_in_flight=None, routes=()) -> TestClient:
            router = await stack.enter_async_context(served_router(models or [fake_model()],
                                                                   max_in_flight=max_in_flight))
            metrics = GatewayMetrics(router)
            app = make_app(GatewayConfig(), router, telemetry=Telemetry(recorder=metrics))
            metrics.add_route(app)
            for path, handler in routes:
                app.router.add_get(path, handler)
            client = TestClient(TestServer(app, handler_cancellation=True))
            await client.start_server()
            stack.push_async_callback(client.close)
            return client

        yield start
