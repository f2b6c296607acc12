"""The admin API: pools and workers, loading from the model roots only, unloading with a drain, auth."""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.admin import FLEET
from poolgate.gateway.app import make_app
from poolgate.gateway.pools.fleet import Fleet
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.config.models import bundled_model_path
from tests.fakes import FakeWorkerClient, fake_front, fake_model, until

FAKE_FACTORY = "tests.workers.fake_factory:build"
KEY = "sk-admin"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
async def admin(tmp_path):
    """``await admin(roots=[...], api_key=..., router=...)`` -> a TestClient whose Fleet spawns fake-model workers."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(*, roots=(), api_key: str | None = KEY, router: Router | None = None,
                        runner_factory: str | None = FAKE_FACTORY) -> TestClient:
            config = GatewayConfig(api_key=api_key, model_roots=tuple(str(Path(r).resolve()) for r in roots),
                                   drain_timeout_s=5.0)
            router = router or Router()
            folder = Path(tempfile.mkdtemp(prefix="pg-admin-"))  # short: Unix socket paths are capped
            stack.callback(shutil.rmtree, folder, ignore_errors=True)
            fleet = Fleet(config, router, folder, runner_factory=runner_factory)
            app = make_app(config, router)
            app[FLEET] = fleet
            client = TestClient(TestServer(app))
            await client.start_server()
            stack.push_async_callback(client.close)
            stack.push_async_callback(router.close)
            stack.push_async_callback(fleet.stop)
            return client

        yield start


def root_with(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "models"
    for name in names:
        (root / name).mkdir(parents=True)
    return root


async def embed(client: TestClient, model: str):
    return await client.post("/v1/embeddings", json={"model": model, "input": "a b"}, headers=AUTH)


async def test_load_serve_list_and_unload_a_model_without_restarting(admin, tmp_path):
    client = await admin(roots=[root_with(tmp_path, "mini")])
    assert (await embed(client, "mini")).status == 404
    resp = await client.post("/admin/models", json={"name": "mini", "model": "mini", "replicas": 2}, headers=AUTH)
    assert resp.status == 201, await resp.text()
    body = await resp.json()
    assert body["id"] == "mini" and [len(p["workers"]) for p in body["pools"]] == [2]
    assert (await embed(client, "mini")).status == 200
    pools = await (await client.get("/admin/pools", headers=AUTH)).json()
    (model,) = pools["data"]
    assert (model["id"], model["default"], model["ready"], model["tasks"]) == ("mini", True, True, ["embed"])
    (pool,) = model["pools"]
    assert pool["backend"] == "cpu" and {w["state"] for w in pool["workers"]} == {"ready"}
    assert set(pool["workers"][0]) >= {"address", "state", "calls_in_flight", "outstanding_tokens", "recoveries"}
    again = await client.post("/admin/models", json={"name": "mini", "model": "mini"}, headers=AUTH)
    assert again.status == 409 and "already served" in (await again.json())["error"]["message"]
    resp = await client.delete("/admin/models/mini", headers=AUTH)
    assert resp.status == 200 and (await resp.json()) == {"id": "mini", "object": "model", "deleted": True}
    assert (await embed(client, "mini")).status == 404
    assert (await client.delete("/admin/models/mini", headers=AUTH)).status == 404
    assert (await (await client.get("/admin/pools", headers=AUTH)).json())["data"] == []


@pytest.mark.parametrize("model", ["../outside", "/etc", "link", "missing", "", None, 3])
async def test_nothing_outside_the_model_roots_is_loaded(admin, tmp_path, model):
    (tmp_path / "outside").mkdir()
    root = root_with(tmp_path, "ok")
    os.symlink(tmp_path / "outside", root / "link")
    client = await admin(roots=[root])
    resp = await client.post("/admin/models", json={"name": "x", "model": model}, headers=AUTH)
    err = (await resp.json())["error"]
    assert resp.status in (400, 403) and err["param"] == "model", err
    assert resp.status == 403 or model in ("", None, 3)
    assert (await client.get("/admin/pools", headers=AUTH)).status == 200 and not client.app[FLEET].running


async def test_an_absolute_path_inside_a_root_is_fine(admin, tmp_path):
    root = root_with(tmp_path, "a")
    client = await admin(roots=[root])
    resp = await client.post("/admin/models", json={"name": "a", "model": str(root / "sub" / ".." / "a")},
                             headers=AUTH)
    assert resp.status == 201, await resp.text()


async def test_without_roots_or_without_an_api_key_the_admin_api_is_off(admin, tmp_path):
    no_roots = await admin()
    resp = await no_roots.post("/admin/models", json={"name": "x", "model": "x"}, headers=AUTH)
    assert resp.status == 403 and "no model roots" in (await resp.json())["error"]["message"]
    no_key = await admin(roots=[root_with(tmp_path, "x")], api_key=None)
    for method, path in (("GET", "/admin/pools"), ("POST", "/admin/models"), ("DELETE", "/admin/models/x")):
        resp = await no_key.request(method, path, json={"model": "x"})
        assert resp.status == 403 and "no API key" in (await resp.json())["error"]["message"]


async def test_the_api_key_is_required(admin):
    client = await admin()
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = await client.get("/admin/pools", headers=headers)
        assert resp.status == 401 and (await resp.json())["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("body, param, message", [
    ({"name": "x", "model": "x", "replicas": -1}, "replicas", "must be >= 0"),
    ({"name": "x", "model": "x", "colour": 1}, "colour", "unknown key"),
    ({"name": "x", "model": "x", "backend": "tpu"}, "backend", "must be one of"),
    ({"name": "x", "model": "x", "remote": [{"url": "tcp://evil:1"}]}, "remote", "config"),
    ({"name": "x", "model": "x", "trust_remote_code": True}, "trust_remote_code", "server's config"),
    ({"name": "x", "model": "x", "allow_pickle_weights": True}, "allow_pickle_weights", "server's config"),
    ({"name": "x", "model": "x", "replicas": 100_000}, "replicas", "at most"),
    ({"name": "x", "model": "x", "pooler_config": {"pooling_type": "NOPE"}}, "pooler_config", ""),
])
async def test_bad_bodies_are_400_naming_the_key(admin, tmp_path, body, param, message):
    client = await admin(roots=[root_with(tmp_path, "x")])
    resp = await client.post("/admin/models", json=body, headers=AUTH)
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["param"] == param and message in err["message"], err
    resp = await client.post("/admin/models", data=b"[1]", headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status == 400 and "JSON object" in (await resp.json())["error"]["message"]


async def test_a_model_whose_workers_cannot_start_is_not_served(admin, tmp_path):
    client = await admin(roots=[root_with(tmp_path, "x")], runner_factory="tests.workers.fake_factory:fail")
    resp = await client.post("/admin/models", json={"name": "x", "model": "x"}, headers=AUTH)
    assert resp.status == 503 and "worker process exited" in (await resp.json())["error"]["message"]
    assert not client.app[FLEET].running and (await embed(client, "x")).status == 404


async def test_unload_drains_the_calls_in_flight_first(admin):
    info = fake_model(name="held").info
    worker = FakeWorkerClient(info)
    worker.gate = asyncio.Event()
    router = Router([WorkerPool(info, [worker], front=fake_front(info))])
    client = await admin(router=router)
    call = asyncio.create_task(embed(client, "held"))
    await until(lambda: worker.calls)
    unload = asyncio.create_task(client.delete("/admin/models/held", headers=AUTH))
    await until(lambda: "held" not in router.pools)
    assert (await embed(client, "held")).status == 404  # no new calls
    await asyncio.sleep(0.1)
    assert not unload.done() and not worker.closed  # waits for the call in flight
    worker.gate.set()
    assert (await call).status == 200
    assert (await unload).status == 200 and worker.closed


@pytest.mark.slow
async def test_the_bundled_model_loads_for_real(admin):
    client = await admin(roots=[bundled_model_path().parent], runner_factory=None)
    resp = await client.post("/admin/models", json={"name": "minilm", "model": "model", "backend": "cpu"},
                             headers=AUTH)
    assert resp.status == 201, await resp.text()
    got = await (await embed(client, "minilm")).json()
    assert len(got["data"][0]["embedding"]) == 384
