"""POST /classify and /v1/classify through the HTTP app and real workers around the fake classifier."""
from __future__ import annotations

import numpy as np
import pytest

from tests.fakes import expected_output, fake_ids, fake_model, fake_probs

LABELS = ("negative", "neutral", "positive")
USAGE_KEYS = {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
              "completion_tokens_details"}


def classifier(**kw):
    return fake_model(tasks=("classify", "token_classify"), **kw)


async def post(client, body, path="/classify"):
    return await client.post(path, json=body)


async def body_of(resp) -> dict:
    assert resp.status == 200, await resp.text()
    return await resp.json()


@pytest.mark.parametrize("path", ["/classify", "/v1/classify"])
async def test_probs_labels_and_the_envelope(gateway, path):
    client = await gateway(models=[classifier(labels=LABELS)])
    resp = await post(client, {"model": "fake-model", "input": ["hello world", "a b c"]}, path)
    body = await body_of(resp)
    assert body["id"] == f"classify-{resp.headers['X-Request-Id']}"
    assert body["object"] == "list" and body["model"] == "fake-model" and isinstance(body["created"], int)
    for i, text in enumerate(["hello world", "a b c"]):
        probs = expected_output(text, "classify", num_labels=3)
        item = body["data"][i]
        assert item["index"] == i and item["num_classes"] == 3
        assert np.float32(item["probs"]).tolist() == probs.tolist()
        assert item["label"] == LABELS[int(np.argmax(probs))]
        assert abs(sum(item["probs"]) - 1) < 1e-5
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9, "completion_tokens": 0,
                             "prompt_tokens_details": None, "completion_tokens_details": None}


async def test_the_labels_differ_between_inputs(gateway):
    """The fake's argmax is not constant, so a wrong label index would show."""
    client = await gateway(models=[classifier(labels=LABELS)])
    texts = ["hello world", "a b c", "x", "the quick brown fox"]
    body = await body_of(await post(client, {"input": texts}))
    labels = [d["label"] for d in body["data"]]
    assert labels == [LABELS[int(np.argmax(expected_output(t, "classify", num_labels=3)))] for t in texts]
    assert len(set(labels)) > 1


async def test_one_label_is_a_sigmoid(gateway):
    client = await gateway(models=[classifier(labels=("relevant",))])
    body = await body_of(await post(client, {"input": "a b"}))
    item = body["data"][0]
    assert item["num_classes"] == 1 and item["label"] == "relevant"
    assert np.float32(item["probs"]).tolist() == expected_output("a b", "classify", num_labels=1).tolist()
    assert 0 < item["probs"][0] < 1


async def test_use_activation_false_gives_the_raw_logits(gateway):
    client = await gateway(models=[classifier(labels=LABELS)])
    body = await body_of(await post(client, {"input": "a b", "use_activation": False}))
    logits = expected_output("a b", "classify", num_labels=3, use_activation=False)
    assert np.float32(body["data"][0]["probs"]).tolist() == logits.tolist()
    assert body["data"][0]["label"] == LABELS[int(np.argmax(logits))]


async def test_a_model_without_label_names_gives_label_null(gateway):
    client = await gateway(models=[classifier(num_labels=4)])
    item = (await body_of(await post(client, {"input": "a b"})))["data"][0]
    assert item["label"] is None and item["num_classes"] == 4


async def test_token_id_inputs_and_usage(gateway):
    client = await gateway(models=[classifier(labels=LABELS)])
    body = await body_of(await post(client, {"input": [[101, 5, 102], [101, 7, 8, 9, 102]]}))
    assert np.float32(body["data"][1]["probs"]).tolist() == fake_probs([101, 7, 8, 9, 102], 3).tolist()
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 8
    single = await body_of(await post(client, {"input": [101, 5, 102]}))
    assert len(single["data"]) == 1 and set(single["usage"]) == USAGE_KEYS


async def test_no_classifier_served_is_404_as_an_unregistered_vllm_route(gateway):
    client = await gateway()
    resp = await post(client, {"input": "a b"})
    assert resp.status == 404
    err = (await resp.json())["error"]
    assert err["message"] == "Not Found" and err["type"] == "NotFoundError"


async def test_naming_an_embedding_model_next_to_a_classifier_is_vllms_400(gateway):
    client = await gateway(models=[fake_model(), classifier(labels=LABELS, name="clf")])
    resp = await post(client, {"input": "a b", "model": "fake-model"})
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["message"] == "Unsupported task: 'classify' Supported tasks: ('embed',)"
    assert (await post(client, {"input": "a b", "model": "clf"})).status == 200


async def test_dimensions_and_other_extras_are_ignored_as_vllm_does(gateway):
    """vLLM's ClassificationRequest has no ``dimensions`` or ``encoding_format``: extra fields, ignored."""
    client = await gateway(models=[classifier(labels=LABELS)])
    plain = await body_of(await post(client, {"input": "a b"}))
    extras = await body_of(await post(client, {"input": "a b", "dimensions": 2, "encoding_format": "base64",
                                               "surprise": [1]}))
    assert extras["data"] == plain["data"]


@pytest.mark.parametrize("body, message, param", [
    ({"input": "a", "normalize": True}, "Parameter `normalize` was removed; use `use_activation` instead.",
     "normalize"),
    ({"input": []}, "You must pass at least one prompt", "input"),
    ({"input": "a", "truncate_prompt_tokens": 33}, "truncate_prompt_tokens value is greater than max_model_len",
     "truncate_prompt_tokens"),
    ({"input": " ".join(["w"] * 40)}, "This model's maximum context length is 32 tokens", "input_tokens"),
    ({"input": 5}, "validation error", "body.input.str"),
])
async def test_bad_requests_are_vllms_400s(gateway, body, message, param):
    client = await gateway(models=[classifier(labels=LABELS)])
    resp = await post(client, body)
    assert resp.status == 400
    err = (await resp.json())["error"]
    kind = "Bad Request" if message == "validation error" else "BadRequestError"  # vLLM's two types
    assert message in err["message"] and err["param"] == param and err["type"] == kind


async def test_truncation(gateway):
    client = await gateway(models=[classifier(labels=LABELS)])
    long = " ".join(f"w{i}" for i in range(40))
    body = await body_of(await post(client, {"input": long, "truncate_prompt_tokens": 5}))
    assert body["usage"]["prompt_tokens"] == 5
    assert np.float32(body["data"][0]["probs"]).tolist() == \
        fake_probs(fake_ids(long, 5), 3).tolist()
