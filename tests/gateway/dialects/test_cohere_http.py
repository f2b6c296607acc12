"""Cohere /v2/embed and /v1/embed over the real app and worker around the fake runner: every embedding type
against the float vector, input_type prompts, truncation modes, and every error in Cohere's shape."""
from __future__ import annotations

import base64
from dataclasses import replace

import numpy as np
import pytest

from tests.dialect_parity import dequantize
from tests.fakes import FakeEncoder, expected_vector, fake_chat_text, fake_model, fake_vector

TEXTS = ["hello world", "the quick brown fox"]
PROMPTS = {"search_query": "query: ", "search_document": "passage: ", "empty": ""}


def with_prompts(model, prompts=PROMPTS, chat_template=False):
    return replace(model, info=replace(model.info, prompts=prompts, chat_template=chat_template))


async def embed(client, body, path="/v2/embed", status=200):
    resp = await client.post(path, json=body)
    out = await resp.json()
    assert resp.status == status, out
    return out


async def test_default_is_float_with_cohere_envelope(gateway):
    client = await gateway()
    resp = await client.post("/v2/embed", json={"texts": TEXTS}, headers={"X-Request-Id": "abc"})
    out = await resp.json()
    assert set(out) == {"id", "embeddings", "texts", "images", "meta", "response_type"}
    assert out["id"] == "embd-abc" and out["texts"] == TEXTS and out["response_type"] == "embeddings_by_type"
    assert out["images"] == []
    assert out["meta"] == {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 10}}
    assert list(out["embeddings"]) == ["float"]
    for got, text in zip(out["embeddings"]["float"], TEXTS):
        assert np.array_equal(np.float32(got), expected_vector(text))


async def test_every_embedding_type_decodes_to_the_float_vector(gateway):
    client = await gateway()
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    out = await embed(client, {"texts": TEXTS, "embedding_types": types})
    assert list(out["embeddings"]) == types
    for i, text in enumerate(TEXTS):
        v = expected_vector(text)
        e = {t: out["embeddings"][t][i] for t in types}
        assert np.array_equal(np.frombuffer(base64.b64decode(e["base64"]), "<f4"), v)
        assert e["int8"] == np.clip(np.rint(v * 127), -128, 127).astype(int).tolist()
        assert e["uint8"] == np.clip(np.rint((v + 1) * 127.5), 0, 255).astype(int).tolist()
        assert e["ubinary"] == np.packbits(v >= 0).astype(int).tolist()
        assert e["binary"] == (np.packbits(v >= 0).astype(int) - 128).tolist()
        assert all(-128 <= x <= 127 for x in e["int8"] + e["binary"]) and all(0 <= x <= 255 for x in e["uint8"])
        assert np.abs(dequantize("int8", e["int8"]) - v).max() <= 0.5 / 127 + 1e-7
        assert np.abs(dequantize("uint8", e["uint8"]) - v).max() <= 0.5 / 127.5 + 1e-7
        assert np.array_equal(dequantize("binary", e["binary"]), np.where(v >= 0, 1.0, -1.0))
        assert np.array_equal(dequantize("ubinary", e["ubinary"]), np.where(v >= 0, 1.0, -1.0))


async def test_inputs_text_items_are_embedded_as_their_text(gateway):
    client = await gateway()
    out = await embed(client, {"inputs": [{"content": [{"type": "text", "text": "hello world"}]},
                                          {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert out["texts"] == ["hello world", "a b"]
    assert np.array_equal(np.float32(out["embeddings"]["float"][1]), expected_vector("a b"))


async def test_v1_embed_answers_floats_without_embedding_types(gateway):
    client = await gateway()
    out = await embed(client, {"texts": TEXTS}, path="/v1/embed")
    assert out["response_type"] == "embeddings_floats" and out["meta"]["api_version"] == {"version": "1"}
    assert np.array_equal(np.float32(out["embeddings"][0]), expected_vector(TEXTS[0]))
    out = await embed(client, {"texts": TEXTS, "embedding_types": ["int8"]}, path="/v1/embed")
    assert out["response_type"] == "embeddings_by_type" and list(out["embeddings"]) == ["int8"]


async def test_input_type_prepends_the_models_prompt(gateway):
    client = await gateway(models=[with_prompts(fake_model())])
    out = await embed(client, {"texts": ["hello world"], "input_type": "search_query"})
    assert np.array_equal(np.float32(out["embeddings"]["float"][0]), expected_vector("query: hello world"))
    assert out["texts"] == ["hello world"]
    out = await embed(client, {"texts": ["hello world"], "input_type": "empty"})
    assert np.array_equal(np.float32(out["embeddings"]["float"][0]), expected_vector("hello world"))


async def test_input_type_is_a_system_turn_with_a_chat_template(gateway):
    client = await gateway(models=[with_prompts(fake_model(), chat_template=True)])
    out = await embed(client, {"texts": ["hello world"], "input_type": "search_document"})
    text = fake_chat_text([{"role": "system", "content": "passage: "}, {"role": "user", "content": "hello world"}])
    want = fake_vector(FakeEncoder().encode([text], add_special_tokens=False)[0])
    assert np.allclose(np.float32(out["embeddings"]["float"][0]), want, atol=1e-7)


async def test_truncate_end_and_start_keep_max_tokens_from_each_side(gateway):
    client = await gateway()
    text = "one two three four five six"
    end = await embed(client, {"texts": [text], "truncate": "END", "max_tokens": 4})
    start = await embed(client, {"texts": [text], "truncate": "START", "max_tokens": 4})
    assert np.array_equal(np.float32(end["embeddings"]["float"][0]), expected_vector("one two"))
    assert np.array_equal(np.float32(start["embeddings"]["float"][0]), expected_vector("five six"))
    assert end["meta"]["billed_units"]["input_tokens"] == start["meta"]["billed_units"]["input_tokens"] == 4
    long = " ".join(["w"] * 40)  # over the fake's 32 tokens: END without max_tokens cuts at the model's max
    out = await embed(client, {"texts": [long]})
    assert out["meta"]["billed_units"]["input_tokens"] == 32
    for mode in ("END", "START"):  # max_tokens over the model's maximum: the maximum
        out = await embed(client, {"texts": [long], "truncate": mode, "max_tokens": 1000})
        assert out["meta"]["billed_units"]["input_tokens"] == 32


async def test_output_dimension_is_matryoshka_dimensions(gateway):
    client = await gateway(models=[fake_model(matryoshka=True)])
    out = await embed(client, {"texts": ["a b"], "output_dimension": 4})
    assert np.array_equal(np.float32(out["embeddings"]["float"][0]), expected_vector("a b", dimensions=4))


@pytest.mark.parametrize("body, status, message", [
    ({}, 400, "Exactly one of texts, images, or inputs must be provided, and it must be non-empty"),
    ({"texts": []}, 400, "Exactly one of texts, images, or inputs must be provided, and it must be non-empty"),
    ({"texts": ["a"], "inputs": [{"content": [{"type": "text", "text": "b"}]}]}, 400,
     "Exactly one of texts, images, or inputs must be provided, and it must be non-empty"),
    ({"images": ["data:image/png;base64,AAAA"]}, 400, "model 'fake-model' reads text only; an input holds image"),
    ({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "model 'fake-model' reads text only; an input holds image"),
    ({"images": ["data:image/png;base64,AAAA"] * 97}, 400, "images: at most 96 per request, got 97"),
    ({"inputs": [{"content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}, 400,
     "inputs[0].content[0]: Cohere inputs take 'text' and 'image_url' parts"),
    ({"texts": ["a"], "input_type": "bogus"}, 400,
     "Unsupported input_type 'bogus'. Supported values: search_query, search_document, classification, clustering."),
    ({"texts": ["one two three four"], "truncate": "NONE", "max_tokens": 3}, 400,
     "Input of 6 tokens exceeds max_tokens=3 with truncate=NONE. Set truncate to END or START to allow truncation."),
    ({"texts": [" ".join(["w"] * 40)], "truncate": "NONE"}, 400, "This model's maximum context length is 32 tokens."),
    ({"texts": ["a"], "output_dimension": 4}, 400, "Model 'fake-model' does not support Matryoshka embeddings"),
    ({"texts": ["a"], "model": "nope"}, 404, "The model `nope` does not exist."),
])
async def test_errors_are_cohere_shaped_with_vllms_messages(gateway, body, status, message):
    client = await gateway()
    out = await embed(client, body, status=status)
    assert set(out) == {"message"} and out["message"].startswith(message)


@pytest.mark.parametrize("body, param", [
    ({"texts": ["a"], "embedding_types": ["int4"]}, "embedding_types"),
    ({"texts": ["a"], "truncate": "MIDDLE"}, "truncate"),
    ({"texts": ["a"], "max_tokens": 0}, "max_tokens"),
    ({"texts": "a"}, "texts"),
])
async def test_invalid_fields_are_400_validation_errors(gateway, body, param):
    client = await gateway()
    out = await embed(client, body, status=400)
    assert set(out) == {"message"} and "validation error" in out["message"] and f"body.{param}" in out["message"]


async def test_unknown_input_type_lists_the_models_types(gateway):
    client = await gateway(models=[with_prompts(fake_model())])
    out = await embed(client, {"texts": ["a"], "input_type": "bogus"}, status=400)
    assert out == {"message": "Unsupported input_type 'bogus'. Supported values: search_query, search_document, "
                              "classification, clustering, empty."}


@pytest.mark.parametrize("input_type", ["search_query", "search_document", "classification", "clustering"])
async def test_a_model_without_prompts_takes_the_standard_types_and_applies_none(gateway, input_type):
    client = await gateway()  # the Cohere SDK always sends an input_type; vLLM answers a plain embedder 400
    out = await embed(client, {"texts": ["hello world"], "input_type": input_type})
    assert np.array_equal(np.float32(out["embeddings"]["float"][0]), expected_vector("hello world"))


async def test_standard_types_map_onto_the_usual_prompt_names(gateway):
    client = await gateway(models=[with_prompts(fake_model(), {"query": "q: ", "passage": "p: "})])
    query = await embed(client, {"texts": ["hello world"], "input_type": "search_query"})
    document = await embed(client, {"texts": ["hello world"], "input_type": "search_document"})
    clustering = await embed(client, {"texts": ["hello world"], "input_type": "clustering"})
    assert np.array_equal(np.float32(query["embeddings"]["float"][0]), expected_vector("q: hello world"))
    assert np.array_equal(np.float32(document["embeddings"]["float"][0]), expected_vector("p: hello world"))
    assert np.array_equal(np.float32(clustering["embeddings"]["float"][0]), expected_vector("hello world"))


async def test_binary_needs_a_dimension_multiple_of_8(gateway):
    client = await gateway(models=[fake_model(dim=12)])
    out = await embed(client, {"texts": ["a"], "embedding_types": ["ubinary"]}, status=400)
    assert "multiple of 8" in out["message"]


async def test_a_classifier_only_server_has_no_embed_route(gateway):
    client = await gateway(models=[fake_model(tasks=("classify",))])
    out = await embed(client, {"texts": ["a"]}, status=404)
    assert out == {"message": "Not Found"}
