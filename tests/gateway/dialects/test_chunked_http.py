"""POST /v1/embeddings with chunked processing on: long inputs pass the gateway's checks and count every token."""
from __future__ import annotations

import numpy as np

from tests.fakes import fake_ids, fake_model, fake_vector

LONG = " ".join(["word"] * 40)  # 42 tokens > the fake's max_model_len of 32: chunks of 32 and 10


def chunked(ids: list[int]) -> np.ndarray:
    """By hand: token-weighted mean of the fake chunk vectors, re-normalized."""
    a, b = fake_vector(ids[:32]).astype(np.float64), fake_vector(ids[32:]).astype(np.float64)
    mean = (32 * a + len(ids[32:]) * b) / len(ids)
    return mean / np.linalg.norm(mean)


async def test_a_long_input_is_200_with_usage_counting_every_token(gateway):
    client = await gateway(models=[fake_model(chunked=True)])
    resp = await client.post("/v1/embeddings", json={"input": ["a b", LONG]})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 4 + 42
    assert np.float32(body["data"][0]["embedding"]).tolist() == fake_vector(fake_ids("a b")).tolist()
    np.testing.assert_allclose(body["data"][1]["embedding"], chunked(fake_ids(LONG)), rtol=1e-6, atol=1e-7)


async def test_truncation_up_to_the_embed_cap_passes_the_gateway(gateway):
    client = await gateway(models=[fake_model(chunked=True, max_embed_len=40)])
    body = await (await client.post("/v1/embeddings", json={"input": LONG, "truncate_prompt_tokens": 36})).json()
    assert body["usage"]["prompt_tokens"] == 36  # > max_model_len, allowed up to max_embed_len
    resp = await client.post("/v1/embeddings", json={"input": LONG, "truncate_prompt_tokens": 41})
    assert resp.status == 400
    assert "truncate_prompt_tokens value is greater than max_embed_len" in (await resp.json())["error"]["message"]
    resp = await client.post("/v1/embeddings", json={"input": LONG})
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["message"].startswith("This model's maximum context length is 40 tokens. "
                                     "However, your prompt contains 42 input tokens")
    assert err["param"] == "input_tokens"
