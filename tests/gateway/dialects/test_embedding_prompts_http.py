"""Per-request prompts on /v1/embeddings (``input_type``, ``prompt_name``; ``dialects.prompts``)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.workers.load.build import load_model
from tests.fakes import expected_vector, fake_model

PROMPTS = {"query": "query: ", "passage": "passage: ", "code": "Represent this code: "}


def prompted(model, prompts=PROMPTS):
    return replace(model, info=replace(model.info, prompts=prompts))


async def embed(client, body, status=200):
    resp = await client.post("/v1/embeddings", json=body)
    out = await resp.json()
    assert resp.status == status, out
    return out


def vector(out, i=0):
    return np.float32(out["data"][i]["embedding"])


@pytest.mark.parametrize("field,value,prefix", [
    ("input_type", "search_query", "query: "), ("input_type", "search_document", "passage: "),
    ("input_type", "code", "Represent this code: "), ("prompt_name", "passage", "passage: "),
    ("input_type", "clustering", ""),  # a standard type the model has no prompt for: none
])
async def test_a_prompt_is_the_prefixed_texts_vector(gateway, field, value, prefix):
    client = await gateway(models=[prompted(fake_model())])
    out = await embed(client, {"input": ["hello world", "a b"], field: value})
    for i, text in enumerate(["hello world", "a b"]):
        assert np.array_equal(vector(out, i), expected_vector(prefix + text))


@pytest.mark.parametrize("body,message", [
    ({"input_type": "bogus"}, "Unsupported input_type 'bogus'. Supported values: search_query, search_document, "
                              "classification, clustering, query, passage, code."),
    ({"prompt_name": "search_query"}, "Unsupported prompt_name 'search_query'. Supported values: query, passage, code."),
    ({"input_type": "search_query", "prompt_name": "query"}, "Give input_type or prompt_name, not both."),
])
async def test_bad_prompt_fields_are_400s(gateway, body, message):
    client = await gateway(models=[prompted(fake_model())])
    out = await embed(client, {"input": "a", **body}, status=400)
    assert out["error"]["message"] == message


async def test_a_model_without_prompts_takes_the_standard_types_only(gateway):
    client = await gateway()
    out = await embed(client, {"input": "hello world", "input_type": "search_query"})
    assert np.array_equal(vector(out), expected_vector("hello world"))
    out = await embed(client, {"input": "a", "prompt_name": "query"}, status=400)
    assert out["error"]["message"] == "Unsupported prompt_name 'query'. This model does not define any prompts."
    out = await embed(client, {"input": [[5, 6]], "input_type": "search_query"})  # no prompt: ids are fine
    assert len(out["data"]) == 1


async def test_token_ids_cannot_take_a_prompt(gateway):
    client = await gateway(models=[prompted(fake_model())])
    out = await embed(client, {"input": [[5, 6]], "input_type": "search_query"}, status=400)
    assert "prefix texts" in out["error"]["message"]


async def test_prompts_match_sentence_transformers_encode_with_a_prompt(gateway):
    from sentence_transformers import SentenceTransformer

    path = str(bundled_model_path())
    model = load_model(WorkerConfig(model=path, served_model_name="m", dtype="float32"))
    client = await gateway(models=[prompted(model)])
    texts = ["How do plants make food?", "Leaves hold chlorophyll."]
    out = await embed(client, {"input": texts, "input_type": "search_query"})
    want = SentenceTransformer(path, device="cpu").encode(texts, prompt="query: ", convert_to_numpy=True)
    got = np.stack([vector(out, i) for i in range(2)])
    assert float((got * want).sum(1).min()) >= 0.99999
