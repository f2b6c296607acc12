"""The official openai SDK, unmodified, against the app on a real TCP port."""
from __future__ import annotations

import contextlib

import numpy as np
import openai
import pytest

from poolgate.gateway.app import make_app
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import expected_vector, fake_model, fake_vector
from tests.gateway.conftest import served_router

LONG = " ".join(["word"] * 40)


@pytest.fixture
async def sdk(live_server):
    """``await sdk(config)`` -> an AsyncOpenAI client for a fresh app over one real (fake-model) worker."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(config: GatewayConfig = GatewayConfig(), api_key: str = "x") -> openai.AsyncOpenAI:
            router = await stack.enter_async_context(served_router([fake_model()]))
            base_url = await live_server(make_app(config, router))
            client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0)
            stack.push_async_callback(client.close)
            return client

        yield start


def expected(*texts: str) -> list[list[float]]:
    return [expected_vector(text).tolist() for text in texts]


async def test_default_base64_is_decoded_by_the_sdk(sdk):
    client = await sdk()
    resp = await client.embeddings.create(model="fake-model", input=["hello world", "a b c"])
    assert [d.embedding for d in resp.data] == expected("hello world", "a b c")
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == 9
    assert resp.model == "fake-model"


async def test_explicit_float(sdk):
    client = await sdk()
    resp = await client.embeddings.create(model="fake-model", input="hello world", encoding_format="float")
    assert np.float32(resp.data[0].embedding).tolist() == expected("hello world")[0]


async def test_token_ids(sdk):
    client = await sdk()
    resp = await client.embeddings.create(model="fake-model", input=[[101, 7, 102], [101, 8, 9, 102]])
    assert [d.embedding for d in resp.data] == [fake_vector([101, 7, 102]).tolist(),
                                                fake_vector([101, 8, 9, 102]).tolist()]
    assert resp.usage.prompt_tokens == 7


async def test_request_id_header_reaches_the_sdk(sdk):
    client = await sdk()
    raw = await client.embeddings.with_raw_response.create(
        model="fake-model", input="x", extra_headers={"X-Request-Id": "sdk-1"})
    assert raw.request_id == "sdk-1"
    assert raw.parse().data[0].index == 0


async def test_unknown_model_raises_not_found(sdk):
    client = await sdk()
    with pytest.raises(openai.NotFoundError) as info:
        await client.embeddings.create(model="nope", input="x")
    assert info.value.message.endswith("The model `nope` does not exist.")
    assert info.value.code == "model_not_found" and info.value.request_id


async def test_bad_requests_raise_bad_request(sdk):
    client = await sdk()
    with pytest.raises(openai.BadRequestError, match="You must pass at least one prompt"):
        await client.embeddings.create(model="fake-model", input=[])
    with pytest.raises(openai.BadRequestError, match="maximum context length is 32 tokens"):
        await client.embeddings.create(model="fake-model", input=LONG)
    with pytest.raises(openai.BadRequestError, match="does not support Matryoshka embeddings"):
        await client.embeddings.create(model="fake-model", input="x", dimensions=4)


async def test_truncation_through_extra_body_and_auto_truncate(sdk):
    client = await sdk()
    resp = await client.embeddings.create(model="fake-model", input=LONG,
                                          extra_body={"truncate_prompt_tokens": -1})
    assert resp.usage.prompt_tokens == 32
    auto = await sdk(GatewayConfig(auto_truncate=True))
    assert (await auto.embeddings.create(model="fake-model", input=LONG)).usage.prompt_tokens == 32


async def test_api_key(sdk):
    config = GatewayConfig(api_key="sekrit")
    with pytest.raises(openai.AuthenticationError):
        await (await sdk(config, api_key="wrong")).embeddings.create(model="fake-model", input="x")
    good = await sdk(config, api_key="sekrit")
    assert len((await good.embeddings.create(model="fake-model", input="x")).data) == 1


async def test_models_list(sdk):
    client = await sdk()
    page = await client.models.list()
    assert [m.id for m in page.data] == ["fake-model"]
    assert page.data[0].owned_by == "poolgate"
