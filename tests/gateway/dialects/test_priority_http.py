"""vLLM's ``priority`` (and Cohere's) on every pooling route reaches each worker Sequence; the default is 0."""
from __future__ import annotations

import pytest

from tests.fakes import fake_model

EMBED = [("/v1/embeddings", {"input": ["a b", "c"]}), ("/pooling", {"input": ["a b", "c"]}),
         ("/v2/embed", {"texts": ["a b", "c"], "embedding_types": ["float"]})]
PAIRS = [("/score", {"text_1": "q", "text_2": ["d1", "d2"]}), ("/rerank", {"query": "q", "documents": ["d1", "d2"]}),
         ("/v2/rerank", {"query": "q", "documents": ["d1", "d2"]})]


def priorities(model) -> list[int]:
    return [s.priority for s in model.runner.batches[-1]]


@pytest.mark.parametrize("path, body", EMBED)
async def test_embedding_routes_carry_priority(gateway, path, body):
    model = fake_model()
    client = await gateway(models=[model])
    resp = await client.post(path, json={**body, "priority": 5})
    assert resp.status == 200, await resp.text()
    assert priorities(model) == [5, 5]
    resp = await client.post(path, json=body)
    assert resp.status == 200 and priorities(model) == [0, 0]


@pytest.mark.parametrize("path, body", PAIRS)
async def test_scoring_routes_carry_priority(gateway, path, body):
    model = fake_model(tasks=("classify",), num_labels=1, dim=1)
    client = await gateway(models=[model])
    resp = await client.post(path, json={**body, "priority": -2})
    assert resp.status == 200, await resp.text()
    assert priorities(model) == [-2, -2]


async def test_classify_carries_priority(gateway):
    model = fake_model(tasks=("classify",), num_labels=2)
    client = await gateway(models=[model])
    resp = await client.post("/classify", json={"input": ["a"], "priority": 3})
    assert resp.status == 200, await resp.text()
    assert priorities(model) == [3]


async def test_a_priority_that_is_not_an_integer_is_a_400(gateway):
    client = await gateway()
    resp = await client.post("/v1/embeddings", json={"input": "a", "priority": "high"})
    assert resp.status == 400
