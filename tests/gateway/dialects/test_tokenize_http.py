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


async def test_tokenize_goes_through_the_pools_one_submit():
    """Pool order, readiness, admission and the retry apply to tokenizer ops as to pooling calls."""
    from poolgate.gateway.pools.job import detokenize_job, tokenize_job
    from poolgate.gateway.pools.model_pools import ModelPools
    from poolgate.gateway.pools.pool import WorkerPool
    from poolgate.shared.errors import Unavailable
    from tests.fakes import FakeWorkerClient

    a, b = FakeWorkerClient(address="fake://a"), FakeWorkerClient(address="fake://b")
    pool = WorkerPool(a.info_, [a, b])
    pools = ModelPools([pool])
    a.fail = Unavailable("connection lost")  # a is picked first (a tie), lost, and the op retried on b
    assert await pools.run(tokenize_job("r", "x y")) == (fake_ids("x y"), None)
    assert pool.state(a) == "down" and pool.in_flight(b) == 0
    assert await pools.run(detokenize_job("r", fake_ids("x y"))) == FakeEncoder().decode(fake_ids("x y"))
    pool.mark_ready(b, False)
    with pytest.raises(Unavailable, match="No worker is ready"):
        await pools.run(tokenize_job("r", "x y"))