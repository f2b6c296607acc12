"""Admission and a tenant's token quota count the tokens the model's own tokenizer counts, for CJK text and code.

A guess of characters / 4 is off by several times for both (CJK: about one token a character; code: a token
for nearly every symbol), so each test is built to pass only on the counted tokens: the limit sits between
what two requests would take as guessed and what they take as counted.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tempfile
from dataclasses import replace

import pytest
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.pools.admission import AdmissionLimits
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.shared.config.frozen import GatewayConfig, Tenant
from poolgate.shared.inputs.front import Front
from poolgate.shared.config.models import bundled_model_path
from poolgate.workers.load.hf_tokenizer import load_encoder, read_tokenizer
from tests.fakes import fake_model, worker_clients

KEY = "sk-counted"
TEXTS = {
    "cjk": "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。",
    "code": "for (int i = 0; i < n; ++i) { a[i] = b[i] * c[i] + d[i]; }",
}


def counted(text: str) -> int:
    return len(read_tokenizer(bundled_model_path())(text)["input_ids"])


def guessed(text: str) -> int:
    return len(text) // 4 + 2  # the estimate the gateway used before it tokenized


@contextlib.asynccontextmanager
async def gateway(config: GatewayConfig, limits: AdmissionLimits):
    """The app over one real worker of a fake model that tokenizes with the bundled MiniLM's tokenizer."""
    model = replace(fake_model(max_model_len=512), encoder=load_encoder(bundled_model_path()))
    with tempfile.TemporaryDirectory(prefix="pg-test-") as folder:
        async with worker_clients([model], folder) as clients:
            pool = WorkerPool(model.info, clients, limits=limits, front=Front(model.info, model.encoder))
            client = TestClient(TestServer(make_app(config, Router([pool]))))
            await client.start_server()
            try:
                yield client, model
            finally:
                await client.close()


def embed(client: TestClient, text: str):
    return client.post("/v1/embeddings", json={"input": text}, headers={"Authorization": f"Bearer {KEY}"})


@pytest.mark.parametrize("kind", list(TEXTS))
async def test_a_tenants_quota_counts_the_tokenizers_tokens(kind):
    text = TEXTS[kind]
    n = counted(text)
    assert 2 * guessed(text) < 2 * n - 1  # guessed, both requests would fit the quota below
    tenant = Tenant("t", (hashlib.sha256(KEY.encode()).hexdigest(),), tokens_per_minute=2 * n - 1)
    async with gateway(GatewayConfig(tenants=(tenant,)), AdmissionLimits()) as (client, _):
        first = await embed(client, text)
        assert first.status == 200 and (await first.json())["usage"]["prompt_tokens"] == n
        second = await embed(client, text)
        assert second.status == 429
        assert f"this request has {n} tokens" in (await second.json())["error"]["message"]


@pytest.mark.parametrize("kind", list(TEXTS))
async def test_admission_counts_the_tokenizers_tokens(kind):
    text = TEXTS[kind]
    n = counted(text)
    assert 2 * guessed(text) < 2 * n - 1  # guessed, the second request would be admitted beside the first
    async with gateway(GatewayConfig(), AdmissionLimits(max_queued_tokens=2 * n - 1)) as (client, model):
        model.runner.release.clear()  # the first request's batch is held on the "device"
        first = asyncio.create_task(embed(client, text))
        await asyncio.to_thread(model.runner.entered.wait, 5)
        second = await embed(client, text)  # n + n > 2n - 1: refused
        assert second.status == 429
        assert f"this request of {n} tokens" in (await second.json())["error"]["message"]
        model.runner.release.set()
        assert (await first).status == 200
