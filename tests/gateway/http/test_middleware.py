"""The edge middleware: request ids, the API key rule, and errors as HTTP bodies."""
from __future__ import annotations

import asyncio
import logging

import pytest

from poolgate.gateway.http.state import ROUTER
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import Overloaded, Unavailable
from tests.fakes import RefusingRunner, fake_model

KEYED = GatewayConfig(api_key="sekrit")


async def test_request_id_is_echoed_or_made(gateway):
    client = await gateway()
    resp = await client.get("/version", headers={"X-Request-Id": "abc-123"})
    assert resp.headers["X-Request-Id"] == "abc-123"
    made = (await client.get("/version")).headers["X-Request-Id"]
    assert len(made) == 32 and int(made, 16) >= 0
    assert (await client.get("/version")).headers["X-Request-Id"] != made


async def test_request_id_is_on_errors_and_in_the_response_id(gateway):
    client = await gateway()
    resp = await client.post("/v1/embeddings", json={"input": []}, headers={"X-Request-Id": "r1"})
    assert resp.status == 400 and resp.headers["X-Request-Id"] == "r1"
    resp = await client.post("/v1/embeddings", json={"input": "x"}, headers={"X-Request-Id": "r2"})
    assert (await resp.json())["id"] == "embd-r2"


async def test_an_unusable_request_id_is_replaced(gateway):
    client = await gateway()
    resp = await client.get("/version", headers={"X-Request-Id": "x" * 1000})
    assert len(resp.headers["X-Request-Id"]) == 32


@pytest.mark.parametrize("path, method", [
    ("/v1/embeddings", "POST"), ("/v1/models", "GET"), ("/v2/embed", "POST"),
    ("/inference/x", "GET"), ("/cohere/x", "GET"),
    ("/classify", "POST"), ("/v1/classify", "POST"), ("/pooling", "POST"),  # vLLM leaves the unprefixed ones open
    ("/score", "POST"), ("/v1/score", "POST"), ("/rerank", "POST"), ("/v2/rerank", "POST"),
    ("/tokenize", "POST"), ("/detokenize", "POST"), ("/invocations", "POST"),
])
async def test_api_key_guards_the_api_prefixes(gateway, path, method):
    client = await gateway(config=KEYED)
    for auth in (None, "Bearer wrong", "sekrit", "Bearer sekrit2"):
        headers = {"Authorization": auth} if auth else {}
        resp = await client.request(method, path, json={"input": "x"}, headers=headers)
        assert resp.status == 401
        body = await resp.json()
        if path in ("/v2/embed", "/v2/rerank"):  # a Cohere route answers in Cohere's shape
            assert body == {"message": "Unauthorized: missing or invalid API key."}
            continue
        err = body["error"]
        assert err["type"] == "AuthenticationError" and err["code"] == "invalid_api_key"


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling"])
async def test_right_api_key_passes(gateway, path):
    client = await gateway(config=KEYED)
    resp = await client.post(path, json={"input": "x"}, headers={"Authorization": "Bearer sekrit"})
    assert resp.status == 200


@pytest.mark.parametrize("path", ["/health", "/ping", "/version", "/openapi.json"])
async def test_api_key_is_not_needed_outside_the_api_prefixes(gateway, path):
    client = await gateway(config=KEYED)
    assert (await client.get(path)).status == 200


async def test_unknown_route_and_wrong_method_in_the_error_shape(gateway):
    client = await gateway()
    resp = await client.get("/v1/nothing")
    assert resp.status == 404
    assert (await resp.json())["error"]["type"] == "NotFoundError"
    resp = await client.get("/v1/embeddings")
    assert resp.status == 405 and resp.headers["Allow"] == "POST"
    err = (await resp.json())["error"]
    assert err["message"] == "Method Not Allowed" and err["code"] == "method_not_allowed"


def fail_submits(client, error: Exception) -> None:
    """Make the fake model's pool raise ``error`` for every call."""
    async def submit(call):
        raise error
    client.app[ROUTER].pools["fake-model"].submit = submit


async def test_unexpected_exceptions_become_a_generic_500(gateway, caplog):
    client = await gateway()
    fail_submits(client, RuntimeError("secret internals at /home/x"))
    with caplog.at_level(logging.ERROR, logger="poolgate.gateway.http.middleware"):
        resp = await client.post("/v1/embeddings", json={"input": "x"})
    assert resp.status == 500
    err = (await resp.json())["error"]
    assert err == {"message": "Internal server error.", "type": "InternalServerError",
                   "param": None, "code": "internal_error"}
    assert "secret internals" in caplog.text


@pytest.mark.parametrize("error, status", [(Overloaded("busy"), 429), (Unavailable("gone"), 503)])
async def test_retry_after_on_429_and_503(gateway, error, status):
    client = await gateway()
    fail_submits(client, error)
    resp = await client.post("/v1/embeddings", json={"input": "x"})
    assert resp.status == status and resp.headers["Retry-After"] == "1"
    assert (await resp.json())["error"]["message"] == error.message


async def test_a_workers_429_reaches_the_client_with_its_own_retry_after(gateway):
    refusal = Overloaded("The worker's queue is full; retry in 7 s.", retry_after_s=7, reason="queue_full")
    runner = RefusingRunner(refusal)
    client = await gateway(models=[fake_model(runner=runner)])
    resp = await client.post("/v1/embeddings", json={"input": "x"})
    assert runner.refused == 1  # the worker refused it, over the real transport
    assert resp.status == 429 and resp.headers["Retry-After"] == "7"
    assert (await resp.json())["error"] == {"message": refusal.message, "type": "RateLimitError", "param": None,
                                            "code": "overloaded"}


async def test_admission_limit_is_429_over_http(gateway):
    model = fake_model()
    model.runner.release.clear()  # hold every batch on the "device"
    client = await gateway(models=[model], max_in_flight=1)
    held = asyncio.create_task(client.post("/v1/embeddings", json={"input": "x"}))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    resp = await client.post("/v1/embeddings", json={"input": "y"})
    assert resp.status == 429 and (await resp.json())["error"]["type"] == "RateLimitError"
    model.runner.release.set()
    assert (await held).status == 200


async def test_error_shape_is_the_routes_own_and_openais_for_unknown_paths(gateway):
    client = await gateway()
    body = await (await client.post("/v2/embed", json={"texts": []})).json()
    assert set(body) == {"message"}  # a Cohere route's own shape
    body = await (await client.get("/v2/embed")).json()  # 405: the path's shape
    assert body == {"message": "Method Not Allowed"}
    body = await (await client.post("/v2/embedz", json={})).json()  # no route: OpenAI's
    assert body["error"]["type"] == "NotFoundError"
    body = await (await client.post("/v1/models")).json()
    assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_an_unknown_path_needs_the_key_and_a_wrong_method_takes_the_paths_rules(gateway):
    client = await gateway(config=KEYED)
    assert (await client.get("/nothing/here")).status == 401  # guarded by default (was 404 outside /v1 etc.)
    assert (await client.get("/nothing/here", headers={"Authorization": "Bearer sekrit"})).status == 404
    assert (await client.post("/health")).status == 405  # a public path stays public on a wrong method
    resp = await client.get("/v2/embed")
    assert resp.status == 401 and await resp.json() == {"message": "Unauthorized: missing or invalid API key."}
