"""POST /tokenize and /detokenize through the app, the transport ops and a real worker's input stage."""
from __future__ import annotations

import pytest

from tests.fakes import CLS, SEP, FakeEncoder, fake_chat_text, fake_ids, fake_model


async def post(client, path, body, status=200) -> dict:
    resp = await client.post(path, json=body)
    assert resp.status == status, await resp.text()
    return await resp.json()


async def test_tokenize_a_prompt(gateway):
    client = await gateway(models=[fake_model(max_model_len=32)])
    body = await post(client, "/tokenize", {"model": "fake-model", "prompt": "hello big world"})
    assert body == {"count": 5, "max_model_len": 32, "tokens": fake_ids("hello big world"), "token_strs": None}
    plain = await post(client, "/tokenize", {"prompt": "hello big world", "add_special_tokens": False,
                                             "return_token_strs": True})
    assert plain["tokens"] == fake_ids("hello big world")[1:-1]
    assert plain["token_strs"] == ["hello", "big", "world"]


async def test_a_prompt_longer_than_the_model_is_counted_not_refused(gateway):
    client = await gateway(models=[fake_model(max_model_len=4)])
    body = await post(client, "/tokenize", {"prompt": "a b c d e f"})
    assert body["count"] == 8 and body["max_model_len"] == 4


async def test_tokenize_chat_messages_with_the_models_template(gateway):
    client = await gateway(models=[fake_model()])
    messages = [{"role": "user", "content": "hi there"}]
    body = await post(client, "/tokenize", {"messages": messages})
    text = fake_chat_text(messages, add_generation_prompt=True)  # vLLM's chat default: true
    assert body["tokens"] == fake_ids(text)[1:-1]  # chat default: no special tokens
    body = await post(client, "/tokenize", {"messages": messages, "add_generation_prompt": False,
                                            "add_special_tokens": True})
    assert body["tokens"] == fake_ids(fake_chat_text(messages))


async def test_detokenize_round_trips(gateway):
    client = await gateway(models=[fake_model()])
    ids = (await post(client, "/tokenize", {"prompt": "alpha beta"}))["tokens"]
    assert (await post(client, "/detokenize", {"tokens": ids}))["prompt"] == "[CLS] alpha beta [SEP]"
    assert ids[0] == CLS and ids[-1] == SEP


@pytest.mark.parametrize("path,body,message", [
    ("/tokenize", {}, "either `prompt` or `messages`"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "either `prompt` or `messages`"),
    ("/tokenize", {"messages": [{"role": "user", "content": "b"}], "continue_final_message": True},
     "Cannot set both"),
    ("/detokenize", {"tokens": [1, 50_000]}, "out of vocabulary"),
    ("/detokenize", {"tokens": ["a"]}, "validation error"),
    ("/tokenize", {"model": "nope", "prompt": "a"}, "does not exist"),
    ("/tokenize", {"prompt": "a\ud800b"}, "not valid Unicode"),  # as on every route, not a 500 in the worker
    ("/tokenize", {"messages": []}, ""),
])
async def test_errors(gateway, path, body, message):
    client = await gateway(models=[fake_model()])
    resp = await client.post(path, json=body)
    assert resp.status in (400, 404)
    assert message in (await resp.json())["error"]["message"]


async def test_the_gateway_tokenizes_itself_with_no_worker_ready(gateway):
    """/tokenize and /detokenize are answered with the model's tokenizer in the gateway: no worker is asked."""
    client = await gateway(ready=False)
    r = await client.post("/tokenize", json={"prompt": "x y"})
    assert r.status == 200 and (await r.json())["tokens"] == fake_ids("x y")
    r = await client.post("/detokenize", json={"tokens": fake_ids("x y")})
    assert r.status == 200 and (await r.json())["prompt"] == FakeEncoder().decode(fake_ids("x y"))
    r = await client.post("/v1/embeddings", json={"input": "x y"})
    assert r.status == 503  # a pooling call does need a worker
