"""TEI's routes through the HTTP app and real workers around the fake model: answers against the fake's known
outputs and the OpenAI route, TEI's error shape, the paths shared with vLLM dispatched by body shape."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from poolgate.gateway.dialects.tei import sparse_values
from poolgate.gateway.http.state import ROUTER
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import Overloaded
from poolgate.shared.domain.sparse import SparseVector
from poolgate.workers.engine.runner_api import LoadedModel
from tests.fakes import FakeEncoder, expected_output, fake_model
from tests.gateway.dialects.test_score_http import cross_encoder

LABELS = ("negative", "neutral", "positive")


def classifier(**kw):
    return fake_model(tasks=("classify", "token_classify"), **kw)


async def ok(resp):
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def openai_vectors(client, texts) -> np.ndarray:
    body = await ok(await client.post("/v1/embeddings", json={"input": texts}))
    return np.float32([d["embedding"] for d in body["data"]])


async def test_embed_is_the_openai_vector_one_list_per_input(gateway):
    client = await gateway()
    texts = ["hello world", "a b c"]
    want = await openai_vectors(client, texts)
    assert np.float32(await ok(await client.post("/embed", json={"inputs": texts}))).tolist() == want.tolist()
    single = await ok(await client.post("/embed", json={"inputs": "hello world"}))
    assert np.float32(single).tolist() == want[:1].tolist()  # a single input is a batch of one
    assert np.float32(await ok(await client.post("/", json={"inputs": texts}))).tolist() == want.tolist()
    raw = np.float32(await ok(await client.post("/embed", json={"inputs": texts, "normalize": False})))
    assert raw.tolist() == np.stack([expected_output(t, use_activation=False) for t in texts]).tolist()
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1)


async def test_embed_takes_token_ids_and_dimensions(gateway):
    client = await gateway(models=[fake_model(matryoshka=True)])
    ids = [[5, 6, 7], [8, 9]]
    want = await ok(await client.post("/v1/embeddings", json={"input": ids, "dimensions": 4}))
    got = await ok(await client.post("/embed", json={"inputs": ids, "dimensions": 4}))
    assert np.float32(got).tolist() == np.float32([d["embedding"] for d in want["data"]]).tolist()
    assert len(got[0]) == 4


async def test_embed_all_answers_every_tokens_vector(gateway):
    client = await gateway(models=[fake_model(tasks=("embed", "token_embed"))])
    got = await ok(await client.post("/embed_all", json={"inputs": ["a b c", "d"]}))
    want = [expected_output(t, "token_embed", use_activation=False) for t in ("a b c", "d")]
    assert [np.float32(g).tolist() for g in got] == [w.tolist() for w in want]
    assert (await client.post("/embed_all", json={"inputs": "a"})).status == 200
    resp = await client.post("/embed_all", json={"inputs": "a", "model": "nope"})
    assert resp.status == 404 and set(await resp.json()) == {"error", "error_type"}


async def test_similarity_is_the_cosine_with_the_source(gateway):
    client = await gateway()
    sentences = ["a b", "hello world", "c"]
    vectors = await openai_vectors(client, ["hello", *sentences])
    got = await ok(await client.post("/similarity", json={
        "inputs": {"source_sentence": "hello", "sentences": sentences}, "parameters": {"truncate": True}}))
    want = vectors[1:] @ vectors[0] / (np.linalg.norm(vectors[1:], axis=1) * np.linalg.norm(vectors[0]))
    assert np.allclose(got, want, atol=1e-6)
    via_root = await ok(await client.post("/", json={"inputs": {"source_sentence": "hello", "sentences": sentences}}))
    assert np.allclose(via_root, want, atol=1e-6)


async def test_predict_single_pair_and_batch(gateway):
    client = await gateway(models=[classifier(labels=LABELS)])
    single = await ok(await client.post("/predict", json={"inputs": "hello world"}))
    probs = expected_output("hello world", "classify", num_labels=3)
    assert [p["label"] for p in single] == [LABELS[i] for i in np.argsort(-probs, kind="stable")]
    assert np.float32(sorted(p["score"] for p in single)).tolist() == np.sort(probs).tolist()
    batch = await ok(await client.post("/predict", json={"inputs": [["hello world"], ["a", "b"]]}))
    assert len(batch) == 2 and batch[0] == single and len(batch[1]) == 3
    pair = await ok(await client.post("/predict", json={"inputs": ["a", "b"]}))
    assert pair == batch[1]  # [text, text_pair] alone is one pair
    raw = await ok(await client.post("/predict", json={"inputs": "hello world", "raw_scores": True}))
    assert abs(sum(p["score"] for p in raw) - 1) > 1e-3  # logits, not probabilities
    assert (await client.post("/", json={"inputs": "hello world"})).status == 200  # a classifier: / is /predict
    resp = await client.post("/predict", json={"inputs": [["a", "b", "c"]]})
    assert resp.status == 400 and (await resp.json())["error_type"] == "Validation"


async def test_rerank_dispatches_by_body_shape_and_answers_in_that_dialect(gateway):
    client = await gateway(models=[cross_encoder()])
    texts = ["doc one", "a second doc", "x"]
    vllm = await ok(await client.post("/rerank", json={"query": "q", "documents": texts}))
    tei = await ok(await client.post("/rerank", json={"query": "q", "texts": texts, "return_text": True}))
    assert [r["index"] for r in tei] == [r["index"] for r in vllm["results"]]
    assert [r["score"] for r in tei] == [r["relevance_score"] for r in vllm["results"]]
    assert all(r["text"] == texts[r["index"]] for r in tei)
    plain = await ok(await client.post("/rerank", json={"query": "q", "texts": texts}))
    assert all("text" not in r for r in plain)
    via_root = await ok(await client.post("/", json={"query": "q", "texts": texts}))
    assert via_root == plain
    bad = await client.post("/rerank", json={"query": "q", "texts": "not a list"})
    assert bad.status == 400 and set(await bad.json()) == {"error", "error_type"}  # TEI's body, TEI's error
    bad = await client.post("/rerank", json={"query": "q", "documents": []})
    assert bad.status == 400 and set(await bad.json()) == {"error"}  # vLLM's body, vLLM's error
    left = await client.post("/rerank", json={"query": "q", "texts": texts, "truncation_direction": "Left"})
    assert left.status == 400 and "truncation_direction" in (await left.json())["error"]


async def test_embed_sparse_lists_the_non_zero_entries_of_a_sparse_model(gateway):
    model = fake_model(dim=16)
    splade = LoadedModel(info=dataclasses.replace(model.info, architecture="BertSpladeSparseEmbeddingModel"),
                         encoder=model.encoder, runner=model.runner, max_batch_tokens=model.max_batch_tokens)
    client = await gateway(models=[splade])
    got = await ok(await client.post("/embed_sparse", json={"inputs": ["a b", "c"]}))
    dense = await ok(await client.post("/embed", json={"inputs": ["a b", "c"]}))  # the model's default activation
    for entries, vector in zip(got, dense):
        vector = np.float32(vector)
        assert [e["index"] for e in entries] == np.flatnonzero(vector > 0).tolist()  # positive weights, by id
        assert np.float32([e["value"] for e in entries]).tolist() == vector[vector > 0].tolist()
    assert sparse_values(SparseVector(np.int64([1, 3]), np.float32([2.5, 1]))) == [
        {"index": 1, "value": 2.5}, {"index": 3, "value": 1.0}]


async def test_embed_sparse_is_404_without_a_sparse_model(gateway):
    client = await gateway()
    resp = await client.post("/embed_sparse", json={"inputs": "a"})
    assert resp.status == 404 and await resp.json() == {"error": "Not Found", "error_type": "Validation"}


@pytest.mark.parametrize("body, where", [
    ({"inputs": []}, "inputs"), ({"inputs": "x", "colour": 1}, "colour"), ({"inputs": 3}, "inputs"),
    ({"inputs": "x", "truncation_direction": "middle"}, "truncation_direction"),
    ({"inputs": "x", "prompt_name": "query"}, "prompt_name"), ({"inputs": "x", "dimensions": 0}, "dimensions"),
])
async def test_bad_bodies_are_400_in_teis_error_shape(gateway, body, where):
    client = await gateway()
    resp = await client.post("/embed", json=body)
    err = await resp.json()
    assert resp.status == 400 and set(err) == {"error", "error_type"} and err["error_type"] == "Validation", err
    assert where in err["error"]


async def test_an_overload_is_teis_overloaded(gateway):
    client = await gateway()

    async def submit(call):
        raise Overloaded("busy")
    client.app[ROUTER].pools["fake-model"].submit = submit
    resp = await client.post("/embed", json={"inputs": "x"})
    assert resp.status == 429 and await resp.json() == {"error": "busy", "error_type": "Overloaded"}


async def test_info_names_the_model_and_its_kind(gateway):
    client = await gateway(config=GatewayConfig(auto_truncate=True), models=[classifier(labels=LABELS)])
    info = await ok(await client.get("/info"))
    assert info["model_id"] == "fake-model" and info["max_input_length"] == 32 and info["auto_truncate"] is True
    assert info["model_type"] == {"classifier": {"id2label": {"0": "negative", "1": "neutral", "2": "positive"},
                                                 "label2id": {"negative": 0, "neutral": 1, "positive": 2}}}
    embedder = await gateway()
    assert (await ok(await embedder.get("/info")))["model_type"] == {"embedding": {"pooling": None}}
    assert info["kernels"] == {}  # the fake worker reports none


async def test_info_says_what_each_op_runs_on_the_worker(gateway):
    model = fake_model()
    kernels = {"cpu_class": "avx2", "attention": "grouped_sdpa (the CPU lacks avx512_bf16)"}
    model = dataclasses.replace(model, info=dataclasses.replace(model.info, kernels=kernels))
    client = await gateway(models=[model])
    assert (await ok(await client.get("/info")))["kernels"] == kernels


async def test_tokenize_dispatches_by_body_shape_and_gives_teis_tokens(gateway):
    client = await gateway()
    tei = await ok(await client.post("/tokenize", json={"inputs": ["hello big world", "a"]}))
    first = tei[0]
    assert [t["special"] for t in first] == [True, False, False, False, True]
    assert [t["text"] for t in first] == ["[CLS]", "hello", "big", "world", "[SEP]"]
    assert [(t["start"], t["stop"]) for t in first] == [(None, None), (0, 5), (6, 9), (10, 15), (None, None)]
    vllm = await ok(await client.post("/tokenize", json={"prompt": "hello big world"}))
    assert [t["id"] for t in first] == vllm["tokens"]  # the same tokenizer, vLLM's shape for vLLM's body
    bare = await ok(await client.post("/tokenize", json={"inputs": "hello", "add_special_tokens": False}))
    assert bare == [[{"id": first[1]["id"], "text": "hello", "special": False, "start": 0, "stop": 5}]]
    bad = await client.post("/tokenize", json={"inputs": 5})
    assert bad.status == 400 and set(await bad.json()) == {"error", "error_type"}


async def test_decode_skips_special_tokens_by_default(gateway):
    client = await gateway()
    ids = (await ok(await client.post("/tokenize", json={"prompt": "hello world"})))["tokens"]
    words = FakeEncoder().decode(ids[1:-1])  # "hello world", unless another test's word shares an id
    assert await ok(await client.post("/decode", json={"ids": ids})) == [words]
    kept = await ok(await client.post("/decode", json={"ids": [ids, ids[1:2]], "skip_special_tokens": False}))
    assert kept == [f"[CLS] {words} [SEP]", words.split()[0]]
    vllm = await ok(await client.post("/detokenize", json={"tokens": ids}))
    assert vllm == {"prompt": f"[CLS] {words} [SEP]"}  # vLLM's /detokenize keeps them, as before


async def test_predict_parameters_top_k_and_logits(gateway):
    """The ``parameters`` huggingface_hub's text_classification sends: top_k, function_to_apply none."""
    client = await gateway(models=[classifier(labels=LABELS)])
    probs = expected_output("hello world", "classify", num_labels=3)
    best = np.argsort(-probs, kind="stable")
    top = await ok(await client.post("/", json={"inputs": "hello world", "parameters": {"top_k": 2}}))
    assert [p["label"] for p in top] == [LABELS[i] for i in best[:2]]
    assert np.float32([p["score"] for p in top]).tolist() == probs[best[:2]].tolist()
    logits = await ok(await client.post("/predict", json={"inputs": "hello world",
                                                          "parameters": {"function_to_apply": "none"}}))
    raw = await ok(await client.post("/predict", json={"inputs": "hello world", "raw_scores": True}))
    assert logits == raw
    resp = await client.post("/predict", json={"inputs": "x", "parameters": {"function_to_apply": "softmax"}})
    assert resp.status == 400 and "function_to_apply" in (await resp.json())["error"]
