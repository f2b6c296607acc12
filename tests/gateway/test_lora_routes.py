"""vLLM's LoRA routes over a real tiny BERT worker (``--max-loras``): load from the model roots (admin key, 403 outside
them), use by ``model`` on /v1/embeddings (PEFT's merged model's vectors), ``parent`` in /v1/models, unload; refusals
name why (rank, a fused-activation target, a name clash, a missing field, a model without slots)."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.config.frozen import GatewayConfig, WorkerConfig
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_checkpoint
from tests.workers.models.test_run_loras import BERT_TARGETS, make_adapter, mean_vectors

pytest.importorskip("peft")
KEY = "sk-admin"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["w1 w2 w3", "w40 w41"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny BERT and, under its model root, adapters: a0 (fits), big (rank 16), inter (a fused-activation target)."""
    base = tmp_path_factory.mktemp("base")
    make_tiny_checkpoint(base)
    root = tmp_path_factory.mktemp("models")
    merged = make_adapter(base, root / "a0", BERT_TARGETS, seed=1)
    make_adapter(base, root / "big", ["query"], seed=2, r=16)
    make_adapter(base, root / "inter", ["intermediate.dense"], seed=3)
    return base, root, merged


def served(base, max_loras=2):
    return load_model(WorkerConfig(model=str(base), served_model_name="base", dtype="float32", max_loras=max_loras,
                                   max_lora_rank=8, pooler_config=PoolerConfig(seq_pooling_type="MEAN"),
                                   max_batch_tokens=256))


def _vectors(body) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float64)


async def test_load_use_list_and_unload_an_adapter(gateway, tiny):
    base, root, merged = tiny
    model = served(base)
    client = await gateway(config=GatewayConfig(api_key=KEY, model_roots=(str(root),)), models=[model])
    r = await client.post("/v1/load_lora_adapter", json={"lora_name": "a0", "lora_path": "a0"}, headers=AUTH)
    assert r.status == 200 and await r.text() == "Success: LoRA adapter 'a0' added successfully."
    r = await client.post("/v1/embeddings", json={"model": "a0", "input": TEXTS}, headers=AUTH)
    assert r.status == 200, await r.text()
    answer = await r.json()
    assert answer["model"] == "a0"  # as vLLM answers
    got = _vectors(answer)
    want = mean_vectors(merged, model.encoder.encode(TEXTS))
    assert float((got * want).sum(1).min()) >= 0.9999
    r = await client.post("/v1/embeddings", json={"model": "base", "input": TEXTS}, headers=AUTH)
    assert np.abs(_vectors(await r.json()) - got).max() > 1e-3  # the base model is not the adapter
    cards = {c["id"]: c for c in (await (await client.get("/v1/models", headers=AUTH)).json())["data"]}
    assert cards["a0"]["parent"] == "base" and cards["a0"]["root"] == str((root / "a0").resolve())
    assert cards["base"]["parent"] is None
    r = await client.post("/v1/embeddings", json={"model": "nope", "input": TEXTS}, headers=AUTH)
    assert r.status == 404
    r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "a0"}, headers=AUTH)
    assert r.status == 200 and "removed successfully" in await r.text()
    assert (await client.post("/v1/unload_lora_adapter", json={"lora_name": "a0"}, headers=AUTH)).status == 404
    r = await client.post("/v1/embeddings", json={"model": "a0", "input": TEXTS}, headers=AUTH)
    assert r.status == 404
    assert model.runner.adapters.slots == {}  # off the worker too


@pytest.mark.parametrize("body, status, why", [
    ({"lora_name": "x", "lora_path": "big"}, 400, "--max-lora-rank 8"),
    ({"lora_name": "x", "lora_path": "inter"}, 400, "activation fused"),
    ({"lora_name": "base", "lora_path": "a0"}, 400, "served base model"),
    ({"lora_name": "x"}, 400, "lora_path"),
    ({"lora_name": "x", "lora_path": "/etc"}, 403, "model roots"),
    ({"lora_name": "x", "lora_path": "../"}, 403, "model roots"),
    ({"lora_name": "x", "lora_path": "a0", "load_inplace": True}, 400, "unload it first"),
])
async def test_refusals_name_why(gateway, tiny, body, status, why):
    base, root, _ = tiny
    client = await gateway(config=GatewayConfig(api_key=KEY, model_roots=(str(root),)), models=[served(base)])
    r = await client.post("/v1/load_lora_adapter", json=body, headers=AUTH)
    assert r.status == status and why in await r.text(), await r.text()


async def test_the_key_guards_the_routes_and_a_model_without_slots_refuses(gateway, tiny):
    base, root, _ = tiny
    client = await gateway(config=GatewayConfig(api_key=KEY, model_roots=(str(root),)), models=[served(base, 0)])
    body = {"lora_name": "a0", "lora_path": "a0"}
    assert (await client.post("/v1/load_lora_adapter", json=body)).status == 401
    r = await client.post("/v1/load_lora_adapter", json=body, headers=AUTH)
    assert r.status == 400 and "--max-loras" in await r.text()
    open_client = await gateway(config=GatewayConfig(model_roots=(str(root),)), models=[served(base)])
    assert (await open_client.post("/v1/load_lora_adapter", json=body)).status == 403  # no API key: off


async def test_a_second_load_of_a_name_is_refused(gateway, tiny):
    base, root, _ = tiny
    client = await gateway(config=GatewayConfig(api_key=KEY, model_roots=(str(root),)), models=[served(base)])
    body = {"lora_name": "a0", "lora_path": "a0"}
    assert (await client.post("/v1/load_lora_adapter", json=body, headers=AUTH)).status == 200
    r = await client.post("/v1/load_lora_adapter", json=body, headers=AUTH)
    assert r.status == 400 and "already been loaded" in await r.text()


async def test_a_restarted_worker_takes_its_pools_adapters_again(gateway, tiny, tmp_path):
    """``loras.restore`` (what the supervisor and discovery call for a new worker): the pool's adapters, loaded."""
    from poolgate.gateway.pools import loras
    from poolgate.gateway.http.state import ROUTER
    from tests.fakes import worker_clients

    base, root, merged = tiny
    client = await gateway(config=GatewayConfig(api_key=KEY, model_roots=(str(root),)), models=[served(base)])
    body = {"lora_name": "a0", "lora_path": "a0"}
    assert (await client.post("/v1/load_lora_adapter", json=body, headers=AUTH)).status == 200
    (pool,) = client.app[ROUTER].pools["base"].pools
    assert pool.loras == {"a0": str((root / "a0").resolve())}
    fresh = served(base)  # a worker started again: no adapters
    async with worker_clients([fresh], tmp_path) as (new,):
        await loras.restore(pool, new)
    assert set(fresh.runner.adapters.slots) == {"a0"}


@pytest.mark.parametrize("path", ["a\x00b", "x" * 5000])
async def test_a_path_no_folder_can_have_is_a_403(gateway, tiny, path):
    base, root, _ = tiny
    client = await gateway(config=GatewayConfig(api_key=KEY, model_roots=(str(root),)), models=[served(base)])
    r = await client.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": path}, headers=AUTH)
    assert r.status == 403, await r.text()
