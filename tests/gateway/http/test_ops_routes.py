"""Ops routes: /v1/models, /health, /ping, /version."""
from __future__ import annotations

from poolgate.shared.version import VERSION
from poolgate.gateway.http.state import ROUTER
from tests.fakes import fake_model


async def test_models_lists_every_served_model(gateway):
    client = await gateway(models=[fake_model(name="a", max_model_len=16), fake_model(name="b")])
    body = await (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    first = body["data"][0]
    assert isinstance(first.pop("created"), int)
    worker = first.pop("worker")
    assert first.pop("backends") == ["cpu"]  # the model's pools, in preference order
    assert first == {"id": "a", "object": "model", "owned_by": "poolgate", "root": "a",
                     "parent": None, "max_model_len": 16, "permission": []}
    info = fake_model(name="a").info
    assert worker == {"backend": info.backend, "device": info.device, "device_name": info.device_name,
                      "dtype": info.dtype, "attention": info.attention, "kernels": {}, "memory": {}}
    assert [m["id"] for m in body["data"]] == ["a", "b"]


async def test_health_is_503_until_every_pool_is_ready(gateway):
    client = await gateway(ready=False)
    for path in ("/health", "/ping"):
        resp = await client.get(path)
        assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"]["type"] == "ServiceUnavailableError"
    resp = await client.post("/v1/embeddings", json={"input": "x"})
    assert resp.status == 503
    pool = client.app[ROUTER].pools["fake-model"]
    pool.mark_ready(pool.clients[0])
    for path in ("/health", "/ping"):
        resp = await client.get(path)
        assert resp.status == 200 and await resp.read() == b""
    assert (await client.post("/ping")).status == 200


async def test_version(gateway):
    client = await gateway()
    assert await (await client.get("/version")).json() == {"version": VERSION}
