"""Every ``/v1/embeddings`` answer has the one envelope ``dialects.envelope.list_response`` builds."""
from __future__ import annotations

import json

import pytest

from tests.fakes import fake_model

BRANCHES = {
    "float": {"input": ["a b", "c"]},
    "base64": {"input": ["a b", "c"], "encoding_format": "base64"},
    "embedding_types": {"input": ["a b", "c"], "embedding_types": ["multi_vector"]},
    "late_chunking": {"input": ["a b", "c"], "late_chunking": True},
    "token_embed": {"input": ["a b", "c"], "model": "tokens"},
}


@pytest.fixture
async def client(gateway):
    return await gateway(models=[fake_model(tasks=("embed", "token_embed")),
                                 fake_model(name="tokens", tasks=("token_embed",))])


@pytest.mark.parametrize("branch", list(BRANCHES))
async def test_every_branch_answers_the_same_envelope(client, branch):
    resp = await client.post("/v1/embeddings", json={"model": "fake-model", **BRANCHES[branch]})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    request_id = resp.headers["X-Request-Id"]
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert body["id"] == f"embd-{request_id}" and body["object"] == "list" and isinstance(body["created"], int)
    assert body["model"] == BRANCHES[branch].get("model", "fake-model")
    tokens = body["usage"]["prompt_tokens"]
    assert tokens > 0 and body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                                            "prompt_tokens_details": None, "completion_tokens_details": None}
    assert [(d["index"], d["object"]) for d in body["data"]] == [(0, "embedding"), (1, "embedding")]


async def test_the_bytes_metadata_is_the_envelope_without_object(client):
    resp = await client.post("/v1/embeddings", json={"input": ["a b", "c"], "encoding_format": "bytes",
                                                       "model": "fake-model"})
    assert resp.status == 200
    metadata = json.loads(resp.headers["metadata"])
    assert list(metadata) == ["id", "created", "model", "data", "usage"]
    assert metadata["id"] == f"embd-{resp.headers['X-Request-Id']}" and metadata["model"] == "fake-model"
    assert metadata["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [(d["index"], d["start"], d["end"]) for d in metadata["data"]] == [(0, 0, 32), (1, 32, 64)]
