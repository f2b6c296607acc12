"""Tenants over HTTP: two keys with different quotas and priorities under shared load, 429 with Retry-After,
the admin API for the main key only, usage per tenant in the metrics (the name, never the key)."""
from __future__ import annotations

import asyncio
import hashlib

import pytest
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.telemetry.metrics import GatewayMetrics
from poolgate.gateway.telemetry.record import Telemetry
from poolgate.shared.telemetry import names
from poolgate.shared.config.frozen import GatewayConfig, Tenant
from tests.fakes import fake_model
from tests.gateway.conftest import served_router

EMBED = "/v1/embeddings"
LIVE, BULK, MAIN = "sk-live-000001", "sk-bulk-000002", "sk-main-000003"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def served():
    model = fake_model()
    tenants = (Tenant("live", (sha(LIVE),), priority=0),
               Tenant("bulk", (sha(BULK),), priority=10, max_concurrent=1, requests_per_minute=3))
    config = GatewayConfig(api_key=MAIN, tenants=tenants)
    async with served_router([model]) as router:
        metrics = GatewayMetrics(router)
        app = make_app(config, router, telemetry=Telemetry(recorder=metrics))
        metrics.add_route(app)
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            yield client, model
        finally:
            model.runner.release.set()
            await client.close()


async def test_each_tenants_default_priority_reaches_the_worker_and_a_request_may_override_it(served):
    client, model = served
    assert (await client.post(EMBED, json={"input": [[1]]}, headers=auth(BULK))).status == 200
    assert [s.priority for s in model.runner.batches[-1]] == [10]
    assert (await client.post(EMBED, json={"input": [[1]]}, headers=auth(LIVE))).status == 200
    assert [s.priority for s in model.runner.batches[-1]] == [0]
    assert (await client.post(EMBED, json={"input": [[1]], "priority": 3}, headers=auth(BULK))).status == 200
    assert [s.priority for s in model.runner.batches[-1]] == [3]


async def test_under_shared_load_only_the_tenant_over_its_quota_gets_429(served):
    client, model = served
    model.runner.release.clear()
    held = asyncio.create_task(client.post(EMBED, json={"input": [[1]]}, headers=auth(BULK)))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    refused = await client.post(EMBED, json={"input": [[2]]}, headers=auth(BULK))  # its one slot is taken
    assert refused.status == 429 and refused.headers["Retry-After"] == "1"
    assert "Tenant 'bulk' is over its quota of 1 requests in flight" in (await refused.json())["error"]["message"]
    live = asyncio.create_task(client.post(EMBED, json={"input": [[3]]}, headers=auth(LIVE)))  # not limited
    model.runner.release.set()
    assert (await held).status == 200 and (await live).status == 200
    text = await (await client.get("/metrics")).text()
    # refused before its body was read: no model yet
    assert f'{names.TENANT_REQUESTS}_total{{model="none",status="429",tenant="bulk"}} 1.0' in text
    assert f'{names.TENANT_REQUESTS}_total{{model="fake-model",status="200",tenant="live"}} 1.0' in text
    assert f'{names.ADMISSION_REJECTIONS}_total{{model="none",reason="tenant_concurrency"}} 1.0' in text
    assert f'{names.TENANT_PROMPT_TOKENS}_total{{model="fake-model",tenant="live"}} 1.0' in text
    assert BULK not in text and LIVE not in text


async def test_requests_per_minute_answer_429_with_the_buckets_retry_after(served):
    client, _ = served
    for _ in range(3):
        assert (await client.post(EMBED, json={"input": [[1]]}, headers=auth(BULK))).status == 200
    refused = await client.post(EMBED, json={"input": [[1]]}, headers=auth(BULK))
    assert refused.status == 429 and 19 <= int(refused.headers["Retry-After"]) <= 20  # 1 request per 20 s


async def test_keys_unknown_keys_and_the_admin_api(served):
    client, _ = served
    assert (await client.post(EMBED, json={"input": "x"})).status == 401
    assert (await client.post(EMBED, json={"input": "x"}, headers=auth("sk-nobody-0000"))).status == 401
    assert (await client.post(EMBED, json={"input": "x"}, headers=auth(MAIN))).status == 200
    assert (await client.get("/admin/pools", headers=auth(LIVE))).status == 403
    assert (await client.get("/admin/pools", headers=auth(MAIN))).status == 200
    assert (await client.get("/health")).status == 200  # public routes need no key


async def test_a_concurrent_burst_cannot_spend_more_than_its_tokens_per_minute():
    """Requests in flight together are each charged before any is answered (their estimate, corrected
    once pooled): a burst of 5 x 8 tokens on a 10-token-a-minute quota is not all admitted."""
    model = fake_model()
    burst = Tenant("burst", (sha(BULK),), tokens_per_minute=10)
    async with served_router([model]) as router:
        client = TestClient(TestServer(make_app(GatewayConfig(tenants=(burst,)), router)))
        await client.start_server()
        try:
            model.runner.release.clear()  # all five in flight at once
            sent = [asyncio.create_task(client.post(EMBED, json={"input": [list(range(1, 9))]}, headers=auth(BULK)))
                    for _ in range(5)]
            await asyncio.to_thread(model.runner.entered.wait, 2)
            await asyncio.sleep(0.2)
            model.runner.release.set()
            statuses = sorted([(await r).status for r in sent])
        finally:
            model.runner.release.set()
            await client.close()
    assert statuses.count(200) <= 2 and statuses.count(429) >= 3, statuses  # 10 tokens: one in, one into debt
