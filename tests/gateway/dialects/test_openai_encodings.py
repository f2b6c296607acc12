"""/v1/embeddings: vLLM's encoding fields (base64 / bytes / bytes_only x embed_dtype x endianness), chat-style
inputs rendered in the worker, and token-level output, over the real app and worker around the fake runner."""
from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest
import torch

from poolgate.gateway.dialects.dtypes import EMBED_DTYPES, to_bfloat16, to_fp8
from tests.fakes import FakeEncoder, expected_vector, fake_chat_text, fake_model, fake_vector

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
VIEW = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.int16,
        "fp8_e4m3": torch.uint8, "fp8_e5m2": torch.uint8}
NP_VIEW = {"float32": np.float32, "float16": np.float16, "bfloat16": np.int16, "fp8_e4m3": np.uint8,
           "fp8_e5m2": np.uint8}
TEXTS = ["hello world", "a b c d"]


def decode(raw: bytes, embed_dtype: str, endianness: str, shape) -> np.ndarray:
    """The client side, as vLLM's example decodes it: numpy view, byte swap, torch dtype view, float32."""
    arr = np.frombuffer(raw, dtype=NP_VIEW[embed_dtype]).copy()
    if endianness not in ("native", sys.byteorder):
        arr = arr.byteswap()
    t = torch.from_numpy(arr).view(TORCH_DTYPES[embed_dtype]) if embed_dtype != "float32" else torch.from_numpy(arr)
    return t.float().numpy().reshape(shape)


def test_storage_codes_match_torch_rounding_on_many_values():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=5000).astype(np.float32) * s for s in (1e-4, 0.05, 1, 300, 3e4)])
    x = np.concatenate([x, np.float32([0, -0.0, 448, 449, 464, 479.9, 480, 1e9, -1e9, 57344, 61439, 61440,
                                       65536, np.inf, -np.inf, 2**-9, 2**-10, 2**-17, 1.5 * 2**-10])])
    t = torch.from_numpy(x)
    assert np.array_equal(to_fp8(x, "fp8_e4m3"), t.to(torch.float8_e4m3fn).view(torch.uint8).numpy())
    assert np.array_equal(to_fp8(x, "fp8_e5m2"), t.to(torch.float8_e5m2).view(torch.uint8).numpy())
    assert np.array_equal(to_bfloat16(x), t.to(torch.bfloat16).view(torch.uint16).numpy())
    assert np.array_equal(EMBED_DTYPES["float16"](x).view(np.uint16),
                          t.to(torch.float16).view(torch.uint16).numpy())


@pytest.mark.parametrize("embed_dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("endianness", ["native", "big", "little"])
async def test_base64_is_the_torch_cast_in_the_asked_order(gateway, embed_dtype, endianness):
    client = await gateway()
    resp = await client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64",
                                                     "embed_dtype": embed_dtype, "endianness": endianness})
    assert resp.status == 200
    for item, text in zip((await resp.json())["data"], TEXTS):
        want = torch.from_numpy(expected_vector(text)).to(TORCH_DTYPES[embed_dtype]).float().numpy()
        got = decode(base64.b64decode(item["embedding"]), embed_dtype, endianness, (8,))
        assert np.array_equal(got, want)


async def test_float_ignores_embed_dtype_as_vllm_does(gateway):
    client = await gateway()
    body = await (await client.post("/v1/embeddings", json={"input": "a b", "embed_dtype": "fp8_e4m3"})).json()
    assert np.array_equal(np.float32(body["data"][0]["embedding"]), expected_vector("a b"))


@pytest.mark.parametrize("embed_dtype", ["float32", "bfloat16", "fp8_e5m2"])
@pytest.mark.parametrize("endianness", ["big", "little"])
async def test_bytes_carry_a_metadata_header_with_each_items_range(gateway, embed_dtype, endianness):
    client = await gateway()
    resp = await client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "bytes",
                                                     "embed_dtype": embed_dtype, "endianness": endianness},
                             headers={"X-Request-Id": "rid-1"})
    assert resp.status == 200 and resp.content_type == "application/octet-stream"
    meta, raw = json.loads(resp.headers["metadata"]), await resp.read()
    assert meta["id"] == "embd-rid-1" and meta["model"] == "fake-model" and isinstance(meta["created"], int)
    assert meta["usage"] == {"prompt_tokens": 10, "total_tokens": 10}
    nbytes = 8 * {"float32": 4, "bfloat16": 2, "fp8_e5m2": 1}[embed_dtype]
    assert len(raw) == 2 * nbytes
    for i, (item, text) in enumerate(zip(meta["data"], TEXTS)):
        assert item == {"index": i, "embed_dtype": embed_dtype, "endianness": endianness,
                        "start": i * nbytes, "end": (i + 1) * nbytes, "shape": [8]}
        want = torch.from_numpy(expected_vector(text)).to(TORCH_DTYPES[embed_dtype]).float().numpy()
        assert np.array_equal(decode(raw[item["start"]:item["end"]], embed_dtype, endianness, (8,)), want)


async def test_bytes_only_is_the_same_body_without_metadata(gateway):
    client = await gateway()
    body = {"input": TEXTS, "embed_dtype": "float16"}
    with_meta = await client.post("/v1/embeddings", json={**body, "encoding_format": "bytes"})
    only = await client.post("/v1/embeddings", json={**body, "encoding_format": "bytes_only"})
    assert "metadata" not in only.headers and await only.read() == await with_meta.read()
    raw = await only.read()
    got = np.frombuffer(raw, dtype=np.float16).reshape(2, 8)  # offsets are i * prod(shape) * nbytes
    assert np.array_equal(got, np.stack([expected_vector(t) for t in TEXTS]).astype(np.float16))


@pytest.mark.parametrize("field, value", [("encoding_format", "hex"), ("embed_dtype", "int8"),
                                          ("endianness", "middle"), ("truncation_side", "middle")])
async def test_unknown_encoding_values_are_vllms_literal_error(gateway, field, value):
    client = await gateway()
    resp = await client.post("/v1/embeddings", json={"input": "x", field: value})
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["param"] == f"body.{field}" and "literal_error" in err["message"]
    assert err["type"] == "Bad Request"


async def test_truncation_side_left_keeps_the_last_tokens(gateway):
    client = await gateway()
    body = {"input": "one two three four five six", "truncate_prompt_tokens": 4}
    left = await (await client.post("/v1/embeddings", json={**body, "truncation_side": "left"})).json()
    right = await (await client.post("/v1/embeddings", json=body)).json()
    assert np.array_equal(np.float32(left["data"][0]["embedding"]), expected_vector("five six"))
    assert np.array_equal(np.float32(right["data"][0]["embedding"]), expected_vector("one two"))


# --- chat-style inputs -------------------------------------------------------------------------------

CONVO = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


def chat_vector(messages, add_generation_prompt=False, special=False) -> np.ndarray:
    text = fake_chat_text(messages, add_generation_prompt)
    return fake_vector(FakeEncoder().encode([text], add_special_tokens=special)[0])


@pytest.mark.parametrize("body", [
    {"messages": CONVO}, {"input": CONVO}, {"messages": [CONVO]}, {"input": [CONVO]},
])
async def test_every_chat_form_is_rendered_by_the_template_in_the_worker(gateway, body):
    client = await gateway()
    resp = await client.post("/v1/embeddings", json=body)
    out = await resp.json()
    assert resp.status == 200, out
    assert out["data"][0]["embedding"] == pytest.approx(chat_vector(CONVO).tolist(), abs=1e-7)
    assert out["usage"]["prompt_tokens"] == len(fake_chat_text(CONVO).split())  # no special tokens by default


async def test_chat_options_reach_the_template(gateway):
    client = await gateway()
    convos = [CONVO, [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]]
    out = await (await client.post("/v1/embeddings", json={
        "messages": convos, "add_generation_prompt": True, "add_special_tokens": True})).json()
    assert out["data"][0]["embedding"] == pytest.approx(chat_vector(CONVO, True, True).tolist(), abs=1e-7)
    parts = [{"role": "user", "content": "a\nb"}]
    assert out["data"][1]["embedding"] == pytest.approx(chat_vector(parts, True, True).tolist(), abs=1e-7)


@pytest.mark.parametrize("body, message", [
    ({"messages": CONVO, "add_generation_prompt": True, "continue_final_message": True},
     "Cannot set both `continue_final_message` and `add_generation_prompt` to True."),
    ({"messages": CONVO, "chat_template": "{{ messages }}"},
     "Chat template is passed with request, but --trust-request-chat-template is not set. "
     "Refused request with untrusted chat template."),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "model 'fake-model' reads text only; an input holds image"),
    ({"messages": [{"role": "user", "content": [{"type": "image_embeds", "image_embeds": "x"}]}]},
     "messages[0].content[0]: 'image_embeds' parts (precomputed embeddings) are not served; send the image or "
     "audio itself"),
    ({"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}]},
     "messages[0].content[0]: unknown content part type 'refusal'; served: text, image_url, input_audio, audio_url"),
    ({"messages": CONVO, "input": "x"}, "Exactly one of `input` or `messages` must be given."),
    ({"messages": [[]]}, "a conversation needs at least one message object"),
    ({"messages": [CONVO, []]}, "a conversation needs at least one message object"),
    ({"messages": []}, "You must pass at least one prompt"),
])
async def test_chat_requests_vllm_refuses_are_400(gateway, body, message):
    client = await gateway()
    resp = await client.post("/v1/embeddings", json=body)
    assert resp.status == 400 and (await resp.json())["error"]["message"] == message


async def test_a_model_without_a_chat_template_is_vllms_400(gateway):
    client = await gateway(models=[fake_model(encoder=FakeEncoder(chat_template=False))])
    resp = await client.post("/v1/embeddings", json={"messages": CONVO})
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["message"].startswith("As of transformers v4.44, default chat template")


# --- token-level output (late-interaction models) -------------------------------------------------------

def token_model():
    return fake_model(tasks=("token_embed", "embed"))


async def test_a_token_embed_model_answers_one_vector_per_token(gateway):
    client = await gateway(models=[token_model()])
    out = await (await client.post("/v1/embeddings", json={"input": ["a b", "c"]})).json()
    rows = [np.asarray(d["embedding"]) for d in out["data"]]
    assert [r.shape for r in rows] == [(4, 8), (3, 8)]
    assert out["usage"]["prompt_tokens"] == 7 and out["id"].startswith("embd-")


@pytest.mark.parametrize("body, message", [
    ({"input": "a", "encoding_format": "base64"}, "Input should be 'float'"),
    ({"input": "a", "encoding_format": "bytes"}, "Input should be 'float'"),
    ({"input": "a", "dimensions": 4}, "dimensions is currently not supported"),
])
async def test_token_embed_takes_float_and_no_dimensions(gateway, body, message):
    client = await gateway(models=[token_model()])
    resp = await client.post("/v1/embeddings", json=body)
    assert resp.status == 400 and message in (await resp.json())["error"]["message"]


# --- /pooling takes the same encodings ----------------------------------------------------------------------

async def test_pooling_bytes_carry_each_token_blocks_shape(gateway):
    client = await gateway(models=[token_model()])
    resp = await client.post("/pooling", json={"input": ["a b", "c"], "task": "token_embed",
                                               "encoding_format": "bytes", "embed_dtype": "float16"})
    assert resp.status == 200 and resp.content_type == "application/octet-stream"
    meta, raw = json.loads(resp.headers["metadata"]), await resp.read()
    assert meta["id"].startswith("pooling-") and [i["shape"] for i in meta["data"]] == [[4, 8], [3, 8]]
    assert meta["data"][1]["start"] == 4 * 8 * 2 and len(raw) == 7 * 8 * 2
    json_out = await (await client.post("/pooling", json={"input": ["a b", "c"], "task": "token_embed"})).json()
    for item, d in zip(meta["data"], json_out["data"]):
        got = np.frombuffer(raw[item["start"]:item["end"]], np.float16).reshape(item["shape"])
        assert np.array_equal(got, np.float32(d["data"]).astype(np.float16))


@pytest.mark.parametrize("embed_dtype", ["bfloat16", "fp8_e4m3"])
async def test_pooling_base64_takes_embed_dtype_and_endianness(gateway, embed_dtype):
    client = await gateway()
    out = await (await client.post("/pooling", json={"input": "a b", "encoding_format": "base64",
                                                     "embed_dtype": embed_dtype, "endianness": "big"})).json()
    want = torch.from_numpy(expected_vector("a b")).to(TORCH_DTYPES[embed_dtype]).float().numpy()
    assert np.array_equal(decode(base64.b64decode(out["data"][0]["data"]), embed_dtype, "big", (8,)), want)


async def test_classify_and_pooling_take_chat_messages_too(gateway):
    client = await gateway(models=[fake_model(tasks=("embed", "token_embed", "classify"))])
    out = await (await client.post("/pooling", json={"messages": CONVO})).json()
    assert out["data"][0]["data"] == pytest.approx(chat_vector(CONVO).tolist(), abs=1e-7)
    resp = await client.post("/classify", json={"messages": CONVO, "add_generation_prompt": True})
    assert resp.status == 200 and len((await resp.json())["data"]) == 1
    resp = await client.post("/classify", json={"messages": CONVO, "chat_template": "x"})
    assert resp.status == 400 and "untrusted chat template" in (await resp.json())["error"]["message"]
