"""POST /v1/embeddings through the HTTP app: responses and every 4xx path."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from poolgate.gateway.dialects.envelope import usage
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import expected_vector, fake_model, fake_vector, fake_word_id

LONG = " ".join(["word"] * 40)  # 42 tokens > the fake's max_model_len of 32


def expected(text: str, **params) -> list[float]:
    return expected_vector(text, **params).tolist()


async def post(client, body, **kw):
    return await client.post("/v1/embeddings", json=body, **kw)


async def error_of(resp, status: int) -> dict:
    assert resp.status == status, await resp.text()
    return (await resp.json())["error"]


async def test_float_response(gateway):
    client = await gateway()
    resp = await post(client, {"model": "fake-model", "input": ["hello world", "a b c"]})
    assert resp.status == 200 and resp.content_type == "application/json"
    body = await resp.json()
    assert [np.float32(d["embedding"]).tolist() for d in body["data"]] == [
        expected("hello world"), expected("a b c")]
    assert body["usage"] == usage(9)
    assert body["model"] == "fake-model" and body["object"] == "list"
    assert body["id"] == f"embd-{resp.headers['X-Request-Id']}"
    assert isinstance(body["created"], int)


async def test_float_and_base64_give_the_same_vectors(gateway):
    client = await gateway()
    texts = ["the quick brown fox", "jumps"]
    floats = await (await post(client, {"input": texts})).json()
    b64 = await (await post(client, {"input": texts, "encoding_format": "base64"})).json()
    for f, b in zip(floats["data"], b64["data"]):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == np.float32(f["embedding"]).tolist()


async def test_token_id_inputs(gateway):
    client = await gateway()
    body = await (await post(client, {"input": [[101, 5, 6, 102], [101, 7, 102]]})).json()
    assert np.float32(body["data"][1]["embedding"]).tolist() == fake_vector([101, 7, 102]).tolist()
    assert body["usage"]["prompt_tokens"] == 7
    single = await (await post(client, {"input": [101, 5, 6, 102]})).json()
    assert len(single["data"]) == 1 and single["usage"]["prompt_tokens"] == 4


async def test_use_activation_false_is_passed_to_the_worker(gateway):
    client = await gateway()
    body = await (await post(client, {"input": "a b", "use_activation": False})).json()
    assert np.float32(body["data"][0]["embedding"]).tolist() == \
        expected("a b", normalize=False)


async def test_too_long_input_is_vllms_400(gateway):
    client = await gateway()
    err = await error_of(await post(client, {"input": LONG}), 400)
    assert err["message"].startswith("This model's maximum context length is 32 tokens. "
                                     "However, your prompt contains 42 input tokens")
    assert err["param"] == "input_tokens"


async def test_truncate_prompt_tokens(gateway):
    client = await gateway()
    body = await (await post(client, {"input": LONG, "truncate_prompt_tokens": -1})).json()
    assert body["usage"]["prompt_tokens"] == 32
    body = await (await post(client, {"input": LONG, "truncate_prompt_tokens": 5})).json()
    assert body["usage"]["prompt_tokens"] == 5
    err = await error_of(await post(client, {"input": "x", "truncate_prompt_tokens": 33}), 400)
    assert "truncate_prompt_tokens value is greater than max_model_len" in err["message"]
    err = await error_of(await post(client, {"input": "x", "truncate_prompt_tokens": -2}), 400)
    assert err["param"] == "body.truncate_prompt_tokens"


async def test_auto_truncate_config(gateway):
    client = await gateway(config=GatewayConfig(auto_truncate=True))
    body = await (await post(client, {"input": LONG})).json()
    assert body["usage"]["prompt_tokens"] == 32


async def test_dimensions(gateway):
    client = await gateway()
    err = await error_of(await post(client, {"input": "x", "dimensions": 4}), 400)
    assert err["message"] == ("Model 'fake-model' does not support Matryoshka embeddings; "
                              "dimensions must be unset (received dimensions=4).")
    mat = await gateway(models=[fake_model(matryoshka=True)])
    body = await (await post(mat, {"input": "a b", "dimensions": 4})).json()
    assert len(body["data"][0]["embedding"]) == 4
    err = await error_of(await post(mat, {"input": "a b", "dimensions": 9}), 400)
    assert "only supports dimensions in range [1, 8], got 9" in err["message"]


async def test_unknown_model_is_404(gateway):
    client = await gateway()
    err = await error_of(await post(client, {"model": "gpt-x", "input": "hi"}), 404)
    assert err == {"message": "The model `gpt-x` does not exist.", "type": "NotFoundError",
                   "param": "model", "code": "model_not_found"}


async def test_empty_input_is_400(gateway):
    client = await gateway()
    err = await error_of(await post(client, {"input": []}), 400)
    assert err["message"] == "You must pass at least one prompt"


@pytest.mark.parametrize("body, param", [
    ({}, "body.input"),
    ({"input": "x", "encoding_format": "hex"}, "body.encoding_format"),
    ({"input": ["a", 1]}, "body.input.str"),
    ({"input": [1, "2"]}, "body.input.str"),
    ({"input": [10**30]}, "body.input.str"),
    ({"input": "x", "dimensions": "many"}, "body.dimensions"),
    ({"input": {"deep": [[[[{"x": None}]]]]}}, "body.input.str"),
    ([1, 2], "body"),
    ("just a string", "body"),
    (None, "body"),
])
async def test_wrong_shapes_and_types_are_400(gateway, body, param):
    client = await gateway()
    resp = await client.post("/v1/embeddings", data=json.dumps(body),
                             headers={"Content-Type": "application/json"})
    err = await error_of(resp, 400)
    assert err["message"].split("\n")[0].endswith(("validation error:", "validation errors:"))
    assert err["param"] == param and err["type"] == "Bad Request"  # vLLM's type for a body that does not validate


@pytest.mark.parametrize("data", [
    b"{", b"{'input': 'x'}", b"", b"\xff\xfe\x00", b"[" * 100_000 + b"]" * 100_000,
    b'{"input": [' + b"9" * 5000 + b"]}",
])
async def test_malformed_json_is_400(gateway, data):
    client = await gateway()
    resp = await client.post("/v1/embeddings", data=data, headers={"Content-Type": "application/json"})
    err = await error_of(resp, 400)
    assert err["message"].startswith("Malformed JSON")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_wrong_content_type_is_400(gateway, content_type):
    client = await gateway()
    headers = {"Content-Type": content_type} if content_type else {}
    resp = await client.post("/v1/embeddings", data=json.dumps({"input": "x"}), headers=headers)
    err = await error_of(resp, 400)
    assert "Unsupported Media Type: Only 'application/json' is allowed" in err["message"]


async def test_json_content_type_with_charset_is_accepted(gateway):
    client = await gateway()
    resp = await client.post("/v1/embeddings", data=json.dumps({"input": "x"}),
                             headers={"Content-Type": "application/json; charset=utf-8"})
    assert resp.status == 200


async def test_body_over_the_size_limit_is_413(gateway):
    client = await gateway(config=GatewayConfig(max_request_bytes=1024))
    err = await error_of(await post(client, {"input": "x" * 4096}), 413)
    assert err["type"] == "RequestEntityTooLargeError"


async def test_add_special_tokens_false_leaves_them_out(gateway):
    client = await gateway()
    body = await (await post(client, {"input": "a b c", "add_special_tokens": False})).json()
    assert body["usage"]["prompt_tokens"] == 3
    assert np.float32(body["data"][0]["embedding"]).tolist() == \
        fake_vector([fake_word_id(w) for w in "a b c".split()]).tolist()
    default = await (await post(client, {"input": "a b c"})).json()
    assert default["usage"]["prompt_tokens"] == 5
