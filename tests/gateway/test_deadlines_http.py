"""Deadlines end to end: X-Request-Timeout answered 504 at the deadline, late work dropped before the
device, a client that leaves has its queued work dropped (the app over a real fake-model worker)."""
from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.serving import TIMEOUT_HEADER, deadline
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import InvalidRequest
from tests.fakes import fake_model
from tests.gateway.conftest import served_router

EMBED = "/v1/embeddings"


def test_the_header_sets_the_deadline_else_the_server_default():
    config = GatewayConfig(request_timeout_s=30.0)
    assert deadline(config, 1000.0) == 1030.0
    assert deadline(config, 1000.0, "0.25") == 1000.25
    assert deadline(GatewayConfig(request_timeout_s=None), 1000.0) is None
    for bad in ("soon", "0", "-1", "nan", "inf"):
        with pytest.raises(InvalidRequest, match=f"{TIMEOUT_HEADER} must be a positive number"):
            deadline(config, 1000.0, bad)


@pytest.fixture
async def served():
    """(client, model, worker client) over an app that cancels the handler of a client that leaves."""
    model = fake_model()
    async with served_router([model]) as router:
        client = TestClient(TestServer(make_app(GatewayConfig(), router), handler_cancellation=True))
        await client.start_server()
        try:
            yield client, model, router.lookup(None).clients[0]
        finally:
            model.runner.release.set()
            await client.close()


async def hold(client, model) -> asyncio.Task:
    """A request whose batch stays on the 'device' until ``model.runner.release`` is set."""
    model.runner.release.clear()
    held = asyncio.create_task(client.post(EMBED, json={"input": [[1]]}))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    return held


async def queued(worker, n: int) -> int:
    """The worker's queued sequences once they are ``n`` (or what they are after 2 s)."""
    for _ in range(200):
        if (count := (await worker.health())["queued"]) == n:
            return count
        await asyncio.sleep(0.01)
    return count


def ran(model) -> list[list[int]]:
    return [s.token_ids for batch in model.runner.batches for s in batch]


async def test_a_request_timeout_is_answered_504_at_its_deadline_and_its_work_dropped(served):
    client, model, worker = served
    held = await hold(client, model)
    start = time.monotonic()
    resp = await client.post(EMBED, json={"input": [[4242]]}, headers={TIMEOUT_HEADER: "0.2"})
    waited = time.monotonic() - start
    assert resp.status == 504 and (await resp.json())["error"]["code"] == "deadline_exceeded"
    assert 0.2 <= waited < 1.0
    assert await queued(worker, 0) == 0  # cancelled in the worker, never to run
    model.runner.release.set()
    assert (await held).status == 200
    assert [4242] not in ran(model)


async def test_a_bad_timeout_header_is_a_400(served):
    client, _, _ = served
    resp = await client.post(EMBED, json={"input": "x"}, headers={TIMEOUT_HEADER: "later"})
    assert resp.status == 400 and TIMEOUT_HEADER in (await resp.json())["error"]["message"]
    resp = await client.post("/tokenize", json={"prompt": "x"}, headers={TIMEOUT_HEADER: "-3"})
    assert resp.status == 400


async def test_a_client_that_leaves_has_its_queued_work_dropped(served):
    client, model, worker = served
    held = await hold(client, model)
    leaving = asyncio.create_task(client.post(EMBED, json={"input": [[4343], [4344]]}))
    assert await queued(worker, 2) == 2
    leaving.cancel()  # drops the connection: the handler is cancelled, the pool cancels the call
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert await queued(worker, 0) == 0
    model.runner.release.set()
    assert (await held).status == 200
    assert [4343] not in ran(model) and [4344] not in ran(model)
