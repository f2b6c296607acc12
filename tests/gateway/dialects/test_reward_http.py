"""Reward scores on POST /pooling as vLLM answers them, from real tiny Qwen2 reward workers in-process:
``{model, input | messages, task: "token_classify"}`` → ``data: [{index, object: "pooling", data: [[...]]}]``,
one row per token (Qwen2ForRewardModel) or per step tag (Qwen2ForProcessRewardModel); embed and classify refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer
from transformers import AutoTokenizer

from poolgate.gateway.app import make_app
from poolgate.shared.config.frozen import GatewayConfig
from tests.gateway.conftest import served_router
from tests.workers.models.test_qwen2_reward import PRM, RM, _load, reference_logits, save_reward

STEP = "<extra_0>"  # Qwen2.5-Math-PRM's step tag
TEXTS = [f"ab{STEP}c d{STEP}", f"x{STEP}"]
TEMPLATE = "{% for m in messages %}{{ m['content'] }}<extra_0>{% endfor %}"  # each turn ends with the step tag
VOCAB = 320


def make_qwen_tokenizer(folder) -> None:
    """A byte-level Qwen2 tokenizer without merges (one token per byte) and the step tag as a special token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    vocab = {c: i for i, c in enumerate(sorted(bytes_to_unicode().values()))}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token="<|endoftext|>",
                               pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": [STEP]})
    tokenizer.save_pretrained(folder)


def _save(folder, architecture: str, labels: int):
    return save_reward(folder, architecture, labels, tokenizer=make_qwen_tokenizer, vocab_size=VOCAB)


def _ids(folder, texts: list[str]) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return [tokenizer(t)["input_ids"] for t in texts]


async def _post(model, body: dict) -> tuple[int, dict]:
    async with served_router([model]) as router, TestClient(TestServer(make_app(GatewayConfig(), router))) as client:
        resp = await client.post("/pooling", json={"model": "rm", **body})
        return resp.status, await resp.json()


async def test_the_reward_model_answers_a_score_per_token(tmp_path):
    body, score = _save(tmp_path, RM, 1)
    want = [torch.sigmoid(x).numpy() for x in reference_logits(body, score, _ids(tmp_path, TEXTS))]
    status, got = await _post(_load(tmp_path), {"input": TEXTS, "task": "token_classify"})
    assert status == 200, got
    assert got["object"] == "list" and got["model"] == "rm"
    assert [(d["index"], d["object"]) for d in got["data"]] == [(0, "pooling"), (1, "pooling")]
    for d, w in zip(got["data"], want, strict=True):
        assert np.asarray(d["data"]).shape == w.shape and np.abs(np.asarray(d["data"]) - w).max() <= 1e-5


async def test_the_process_reward_model_answers_a_row_per_step(tmp_path):
    body, score = _save(tmp_path, PRM, 2)
    ids = _ids(tmp_path, TEXTS)
    tag = AutoTokenizer.from_pretrained(str(tmp_path)).convert_tokens_to_ids(STEP)
    logits = reference_logits(body, score, ids)
    want = [torch.softmax(x[torch.tensor(s) == tag], dim=-1).numpy() for x, s in zip(logits, ids, strict=True)]
    model = _load(tmp_path, pooling_type="STEP", step_tag_id=tag)
    status, got = await _post(model, {"input": TEXTS})  # the model's one task is its default
    assert status == 200, got
    assert [np.asarray(d["data"]).shape for d in got["data"]] == [(2, 2), (1, 2)]
    for d, w in zip(got["data"], want, strict=True):
        assert np.abs(np.asarray(d["data"]) - w).max() <= 1e-5


async def test_messages_are_scored_through_the_chat_template(tmp_path):
    _save(tmp_path, PRM, 2)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(tmp_path)
    model = _load(tmp_path, pooling_type="STEP", step_tag_id=tokenizer.convert_tokens_to_ids(STEP))
    messages = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "one and one"},
                {"role": "assistant", "content": "two"}]
    status, got = await _post(model, {"messages": messages, "task": "token_classify"})
    assert status == 200, got
    rows = np.asarray(got["data"][0]["data"])
    assert rows.shape == (3, 2) and np.allclose(rows.sum(1), 1.0)


@pytest.mark.parametrize("task", ["embed", "classify", "token_embed"])
async def test_what_a_reward_model_does_not_serve_is_refused(tmp_path, task):
    _save(tmp_path, RM, 1)
    status, got = await _post(_load(tmp_path), {"input": TEXTS, "task": task})
    assert status == 400
    assert got["error"]["message"] == f"Unsupported task: {task!r} Supported tasks: ('token_classify',)"
