"""POST /invocations: the body's shape picks the route, as vLLM's SageMaker dispatch does."""
from __future__ import annotations

import pytest

from tests.fakes import expected_output, expected_vector, fake_model


async def invoke(client, body, status=200) -> dict:
    resp = await client.post("/invocations", json=body)
    assert resp.status == status, await resp.text()
    return await resp.json()


async def test_an_embedding_body_on_an_embedding_model(gateway):
    client = await gateway(models=[fake_model()])
    body = await invoke(client, {"input": ["hello world"]})
    assert body["id"].startswith("embd-") and body["data"][0]["object"] == "embedding"
    assert body["data"][0]["embedding"] == pytest.approx(expected_vector("hello world").tolist(), rel=1e-6)


async def test_rerank_and_score_bodies_on_a_bi_encoder(gateway):
    client = await gateway(models=[fake_model()])
    reranked = await invoke(client, {"query": "a b", "documents": ["c", "a b"]})
    assert reranked["results"][0]["index"] == 1  # the identical document first
    scored = await invoke(client, {"text_1": "a b", "text_2": ["c", "a b"]})
    assert scored["object"] == "list" and scored["data"][1]["score"] == pytest.approx(1.0, abs=1e-6)


async def test_a_classifier_classifies_and_falls_back_to_pooling(gateway):
    client = await gateway(models=[fake_model(tasks=("classify", "token_classify"), num_labels=3, dim=3)])
    classified = await invoke(client, {"input": "x y"})
    assert classified["id"].startswith("classify-")
    assert classified["data"][0]["probs"] == pytest.approx(
        expected_output("x y", "classify", num_labels=3).tolist(), rel=1e-6)
    # no rerank/score on a three-label classifier: a rerank body fits none of the offered routes
    out = await invoke(client, {"query": "a", "documents": ["b"]}, status=400)
    assert out["error"]["message"] == ("Cannot find suitable handler for request. Expected one of: "
                                       "['ClassificationRequest', 'PoolingRequest']")


async def test_a_token_model_gets_pooling(gateway):
    client = await gateway(models=[fake_model(tasks=("token_classify",))])
    body = await invoke(client, {"input": "a b"})
    assert body["id"].startswith("pooling-") and len(body["data"][0]["data"]) == 4


async def test_removed_params_and_bad_bodies(gateway):
    client = await gateway(models=[fake_model()])
    out = await invoke(client, {"input": "a", "normalize": True}, status=400)  # fits no request model
    assert out["error"]["message"].startswith("Cannot find suitable handler for request.")
    out = await invoke(client, {"nothing": 1}, status=400)
    assert out["error"]["message"].startswith("Cannot find suitable handler for request. Expected one of: "
                                              "['EmbeddingRequest', 'RerankRequest', 'ScoreRequest', ")
    resp = await client.post("/invocations", data=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert resp.status == 400
