"""Jina's ``task`` on /v1/embeddings picks a per-request task adapter (jina-embeddings-v3, ``jina_task: per_request``,
real worker): each task's vectors equal the model merged at load for that task; a task the model lacks, or any task
on a model without adapters, is a 400 naming the field."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.limits import check_params
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import ModelInfo
from tests.workers.models import test_jina_v3 as v3
from tests.workers.pooled import pool_texts

TEXTS = ["hello world", "a b c d e", "xyz"]


async def _embed(client, body, status=200) -> dict:
    resp = await client.post("/v1/embeddings", json={"model": "j3", **body})
    assert resp.status == status, await resp.text()
    return await resp.json()


async def test_task_picks_the_adapter_and_equals_the_merged_model(gateway, tmp_path):
    v3._checkpoint(tmp_path)
    client = await gateway(models=[v3._load(tmp_path, jina_task="per_request")])
    for task in ("retrieval.query", "classification"):
        got = await _embed(client, {"input": TEXTS, "task": task})
        want, _ = pool_texts(v3._load(tmp_path, jina_task=task), TEXTS)
        np.testing.assert_allclose([d["embedding"] for d in got["data"]], want, atol=1e-5)
    default = await _embed(client, {"input": TEXTS})
    want, _ = pool_texts(v3._load(tmp_path), TEXTS)  # no task: the model's default, text-matching
    np.testing.assert_allclose([d["embedding"] for d in default["data"]], want, atol=1e-5)


async def test_an_unknown_task_is_a_400_listing_the_models_tasks(gateway, tmp_path):
    v3._checkpoint(tmp_path)
    client = await gateway(models=[v3._load(tmp_path, jina_task="per_request")])
    err = (await _embed(client, {"input": TEXTS, "task": "code"}, status=400))["error"]
    assert err["param"] == "task"
    assert err["message"] == ("task 'code' is not one of model 'j3''s tasks: retrieval.query, retrieval.passage, "
                              "separation, classification, text-matching")


async def test_a_merged_model_takes_only_its_own_task(gateway, tmp_path):
    v3._checkpoint(tmp_path)
    client = await gateway(models=[v3._load(tmp_path, jina_task="separation")])
    await _embed(client, {"input": TEXTS, "task": "separation"})
    err = (await _embed(client, {"input": TEXTS, "task": "retrieval.query"}, status=400))["error"]
    assert err["param"] == "task" and "tasks: separation" in err["message"]


async def test_task_on_a_model_without_adapters_is_a_400(gateway):
    client = await gateway()
    resp = await client.post("/v1/embeddings", json={"input": "a b", "task": "retrieval.query"})
    assert resp.status == 400, await resp.text()
    err = (await resp.json())["error"]
    assert err["param"] == "task"
    assert err["message"] == "task 'retrieval.query': model 'fake-model' has no task adapters"


async def test_cohere_embed_takes_task_too(gateway, tmp_path):
    v3._checkpoint(tmp_path)
    client = await gateway(models=[v3._load(tmp_path, jina_task="per_request")])
    resp = await client.post("/v2/embed", json={"model": "j3", "texts": TEXTS, "task": "separation",
                                                "embedding_types": ["float"]})
    assert resp.status == 200, await resp.text()
    want, _ = pool_texts(v3._load(tmp_path, jina_task="separation"), TEXTS)
    np.testing.assert_allclose((await resp.json())["embeddings"]["float"], want, atol=1e-5)
    resp = await client.post("/v2/embed", json={"model": "j3", "texts": TEXTS, "task": "code",
                                                "embedding_types": ["float"]})
    assert resp.status == 400 and "is not one of model 'j3''s tasks" in await resp.text()


def test_every_output_of_a_call_runs_the_calls_task():
    info = ModelInfo(served_model_name="j3", architecture="JinaRobertaModel", tasks=("embed", "token_embed"),
                     max_model_len=64, embedding_dim=32, backend="cpu", dtype="float32", adapters=("a", "b"))
    check_params(info, PoolingParams(adapter="a", outputs=(PoolingParams(task="token_embed", adapter="a"),)))
    with pytest.raises(InvalidRequest, match="every output of one call runs the same forward: task differs"):
        check_params(info, PoolingParams(adapter="a", outputs=(PoolingParams(task="token_embed", adapter="b"),)))
