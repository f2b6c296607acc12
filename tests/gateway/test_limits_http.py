"""Request limits over HTTP, each a 4xx in the route's error shape naming its flag: body bytes (413),
characters per input, documents per rerank; and each limit is in ``serve --help``."""
from __future__ import annotations

import argparse
import contextlib
import tempfile

import pytest
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway import serve
from poolgate.gateway.app import make_app
from poolgate.gateway.pools.fleet import admission_limits
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.shared.config.frozen import GatewayConfig, PoolConfig
from tests.fakes import fake_front, fake_model, worker_clients


@contextlib.asynccontextmanager
async def app_with(config: GatewayConfig, model):
    """The app over one real worker, its pool's admission built from ``config`` as the fleet builds it."""
    with tempfile.TemporaryDirectory(prefix="pg-test-") as folder:
        async with worker_clients([model], folder) as clients:
            pool = WorkerPool(model.info, clients, limits=admission_limits(config, PoolConfig(model=None)),
                              front=fake_front(model.info))
            client = TestClient(TestServer(make_app(config, Router([pool]))))
            await client.start_server()
            try:
                yield client
            finally:
                await client.close()


async def test_a_body_over_max_request_bytes_is_a_413_in_the_routes_shape():
    async with app_with(GatewayConfig(max_request_bytes=1000), fake_model()) as client:
        resp = await client.post("/v1/embeddings", json={"input": "x" * 2000})
        assert resp.status == 413
        error = (await resp.json())["error"]
        assert "--max-request-bytes" in error["message"] and error["code"] == "request_entity_too_large"
        resp = await client.post("/v2/embed", json={"texts": ["x" * 2000]})
        assert resp.status == 413 and "--max-request-bytes" in (await resp.json())["message"]


async def test_an_input_over_max_chars_per_input_is_a_400_before_tokenizing():
    model = fake_model()
    async with app_with(GatewayConfig(max_chars_per_input=50), model) as client:
        resp = await client.post("/v1/embeddings", json={"input": ["short", "y" * 51]})
        assert resp.status == 400 and "--max-chars-per-input" in (await resp.json())["error"]["message"]
        resp = await client.post("/tokenize", json={"prompt": "z" * 60})
        assert resp.status == 400
        assert model.encoder.calls == []  # refused before the worker's tokenizer saw it
        assert (await client.post("/v1/embeddings", json={"input": "y" * 50})).status == 200


async def test_documents_over_max_documents_per_rerank_are_a_400():
    model = fake_model(tasks=("classify",), num_labels=1, dim=1)
    async with app_with(GatewayConfig(max_documents_per_rerank=2), model) as client:
        body = {"query": "q", "documents": ["a", "b", "c"]}
        resp = await client.post("/rerank", json=body)
        assert resp.status == 400 and "--max-documents-per-rerank" in (await resp.json())["error"]["message"]
        resp = await client.post("/v2/rerank", json=body)
        assert resp.status == 400 and "limit is 2" in (await resp.json())["message"]
        assert (await client.post("/rerank", json={"query": "q", "documents": ["a", "b"]})).status == 200


def test_every_limit_is_in_serve_help():
    parser = argparse.ArgumentParser(prog="poolgate serve")
    serve.add_arguments(parser)
    text = parser.format_help()
    for flag in ("--max-request-bytes", "--max-inputs-per-request", "--max-chars-per-input",
                 "--max-documents-per-rerank", "--max-tokens-per-request", "--max-queued-seconds"):
        assert flag in text


@pytest.mark.parametrize("flags, key, value", [
    (["--max-request-bytes", "5000"], "max_request_bytes", 5000),
    (["--max-chars-per-input", "77"], "max_chars_per_input", 77),
    (["--max-documents-per-rerank", "9"], "max_documents_per_rerank", 9),
])
def test_the_limit_flags_reach_the_config(flags, key, value):
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert getattr(serve.config_from_args(parser.parse_args(flags), {}), key) == value
