"""POST /pooling through the HTTP app and real workers: every task's data shape, the default task, the 400s."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.fakes import expected_output, fake_ids, fake_model

LABELS = ("O", "B-PER", "I-PER")
EMBEDDER = dict(tasks=("embed", "token_embed"))
CLASSIFIER = dict(tasks=("classify", "token_classify"), labels=LABELS)


async def post(client, body):
    return await client.post("/pooling", json=body)


async def body_of(resp) -> dict:
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def error_of(resp, status: int = 400) -> dict:
    assert resp.status == status, await resp.text()
    return (await resp.json())["error"]


@pytest.mark.parametrize("model, task, shape_of", [
    (EMBEDDER, "embed", lambda ids: (8,)),
    (EMBEDDER, "token_embed", lambda ids: (len(ids), 8)),
    (CLASSIFIER, "classify", lambda ids: (3,)),
    (CLASSIFIER, "token_classify", lambda ids: (len(ids), 3)),
])
async def test_each_task_gives_its_data_shape_and_values(gateway, model, task, shape_of):
    client = await gateway(models=[fake_model(**model)])
    texts = ["hello world", "a b c d"]
    resp = await post(client, {"input": texts, "task": task})
    body = await body_of(resp)
    assert body["id"] == f"pooling-{resp.headers['X-Request-Id']}"
    assert body["object"] == "list" and body["model"] == "fake-model" and isinstance(body["created"], int)
    for i, text in enumerate(texts):
        item = body["data"][i]
        assert item["index"] == i and item["object"] == "pooling"
        data = np.float32(item["data"])
        assert data.shape == shape_of(fake_ids(text))
        assert data.tolist() == expected_output(text, task, num_labels=3).tolist()
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 10, "completion_tokens": 0,
                             "prompt_tokens_details": None, "completion_tokens_details": None}


@pytest.mark.parametrize("model, task", [
    (dict(tasks=("embed",)), "embed"),
    (EMBEDDER, "embed"),
    (dict(tasks=("token_embed", "embed")), "token_embed"),  # --pooler-config '{"task": "token_embed"}'
    (CLASSIFIER, "classify"),
    (dict(tasks=("token_classify",), labels=LABELS), "token_classify"),
])
async def test_no_task_is_the_models_active_task_its_first(gateway, model, task):
    client = await gateway(models=[fake_model(**model)])
    body = await body_of(await post(client, {"input": "a b"}))
    assert np.float32(body["data"][0]["data"]).tolist() == expected_output("a b", task, num_labels=3).tolist()


async def test_use_activation_reaches_the_pooler(gateway):
    client = await gateway(models=[fake_model(tasks=("embed", "token_embed", "classify"))])
    for task in ("embed", "token_embed", "classify"):
        body = await body_of(await post(client, {"input": "a b", "task": task, "use_activation": False}))
        assert np.float32(body["data"][0]["data"]).tolist() == \
            expected_output("a b", task, use_activation=False).tolist()


@pytest.mark.parametrize("task", ["embed", "token_embed", "token_classify"])
async def test_base64_is_the_items_float32_bytes_row_major(gateway, task):
    client = await gateway(models=[fake_model(tasks=("embed", "token_embed", "token_classify"), num_labels=3)])
    floats = await body_of(await post(client, {"input": ["a b", "c"], "task": task}))
    b64 = await body_of(await post(client, {"input": ["a b", "c"], "task": task, "encoding_format": "base64"}))
    for f, b, text in zip(floats["data"], b64["data"], ["a b", "c"]):
        raw = base64.b64decode(b["data"])
        expected = expected_output(text, task, num_labels=3)
        assert raw == expected.astype("<f4").tobytes()
        assert np.frombuffer(raw, "<f4").reshape(expected.shape).tolist() == np.float32(f["data"]).tolist()


async def test_token_id_inputs(gateway):
    client = await gateway(models=[fake_model(**EMBEDDER)])
    body = await body_of(await post(client, {"input": [101, 5, 6, 102], "task": "token_embed"}))
    assert np.float32(body["data"][0]["data"]).shape == (4, 8)
    assert body["usage"]["prompt_tokens"] == 4


@pytest.mark.parametrize("task", ["classify", "token_classify", "plugin"])  # vLLM's embed suite: plugin too
async def test_a_task_the_model_does_not_serve_is_vllms_400(gateway, task):
    client = await gateway(models=[fake_model(**EMBEDDER)])
    err = await error_of(await post(client, {"input": "a", "task": task}))
    assert err["message"] == f"Unsupported task: {task!r} Supported tasks: ('embed', 'token_embed')"
    assert err["param"] == "task" and err["type"] == "BadRequestError"


@pytest.mark.parametrize("task, message", [
    ("score", "`score` task was removed; use `classify` instead."),
    ("encode", "`encode` task was removed; use `token_embed` or `token_classify` instead."),
])
async def test_removed_task_names(gateway, task, message):
    client = await gateway()
    err = await error_of(await post(client, {"input": "a", "task": task}))
    assert err["message"] == message and err["param"] == "task"


async def test_dimensions_is_refused(gateway):
    client = await gateway(models=[fake_model(matryoshka=True)])
    err = await error_of(await post(client, {"input": "a", "dimensions": 4}))
    assert err["message"] == "dimensions is currently not supported" and err["param"] == "dimensions"


@pytest.mark.parametrize("body, message", [
    ({"input": "a", "task": "nope"}, "validation error"),
    ({"input": "a", "encoding_format": "hex"}, "validation error"),
    ({"input": "a", "normalize": False}, "Parameter `normalize` was removed"),
    ({"input": []}, "You must pass at least one prompt"),
])
async def test_other_400s(gateway, body, message):
    client = await gateway()
    assert message in (await error_of(await post(client, body)))["message"]


async def test_unknown_model_is_404(gateway):
    client = await gateway()
    err = await error_of(await post(client, {"input": "a", "model": "nope"}), 404)
    assert err["message"] == "The model `nope` does not exist."
