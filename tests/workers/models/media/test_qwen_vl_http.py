"""A tiny jina-reranker-m0 and a tiny Qwen2-VL embedder served by ``poolgate serve`` (gateway, transport, worker):
the media plan is built in the gateway from the tokenizer files the worker sent, the images ride the transport as
arrays, and the answers equal transformers' reference over HTTP."""

from __future__ import annotations

import numpy as np
import pytest
import requests
import torch

from tests.live_server import live_server
from tests.workers.models.media import qwen_vl_tiny as tiny
from tests.workers.models.media.test_qwen_vl import _jina_reference, _make_reranker, _png

PH = "<|vision_start|><|image_pad|><|vision_end|>"

pytest.importorskip("transformers")


def test_rerank_and_score_over_http(tmp_path):
    model = tmp_path / "jina"
    processor, ref, head = _make_reranker(model)
    query, docs = "w1 w2", ["w5 w6 w7", "w9", "w3 w3 w4"]
    want = [_jina_reference(processor, ref, head, d, query, []) for d in docs]
    with live_server(tmp_path, str(model), "--served-model-name", "m", "--dtype", "float32") as server:
        body = requests.post(f"{server.url}/rerank", json={"model": "m", "query": query, "documents": docs},
                             timeout=60).json()
        got = {r["index"]: r["relevance_score"] for r in body["results"]}
        assert [got[i] for i in range(len(docs))] == pytest.approx(want, abs=1e-5)
        assert [r["index"] for r in body["results"]] == sorted(range(len(docs)), key=lambda i: -want[i])
        score = requests.post(f"{server.url}/score", json={"model": "m", "text_1": query, "text_2": docs[0]},
                              timeout=60).json()
        assert score["data"][0]["score"] == pytest.approx(want[0], abs=1e-5)
        # image documents (vLLM's content lists): a page alone, and a caption with its page
        page, other = tiny.image(11, 90, 140), tiny.image(12, 40, 40)
        documents = [{"content": [{"type": "image_url", "image_url": {"url": _png(page).url}}]},
                     {"content": [{"type": "text", "text": "w8"},
                                  {"type": "image_url", "image_url": {"url": _png(other).url}}]},
                     "w5 w6 w7"]
        want = [_jina_reference(processor, ref, head, PH, query, [page]),
                _jina_reference(processor, ref, head, "w8" + PH, query, [other]), want[0]]
        body = requests.post(f"{server.url}/rerank", json={"model": "m", "query": query, "documents": documents},
                             timeout=60).json()
        got = {r["index"]: r["relevance_score"] for r in body["results"]}
        assert [got[i] for i in range(3)] == pytest.approx(want, abs=1e-5), body


def test_embeddings_over_http(tmp_path):
    model = tmp_path / "qwen2_vl"
    processor, ref = tiny.make(model)
    texts = ["w1 w2 w3", "a photo of w7"]
    with live_server(tmp_path, str(model), "--served-model-name", "m", "--dtype", "float32") as server:
        body = requests.post(f"{server.url}/v1/embeddings", json={"model": "m", "input": texts}, timeout=60).json()
        pic = tiny.image(13, 70, 100)
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _png(pic).url}},
                                                  {"type": "text", "text": "a photo of w2"}]}]
        chat = requests.post(f"{server.url}/v1/embeddings", json={"model": "m", "messages": messages},
                             timeout=60).json()
        doc = {"content": [{"type": "image_url", "image_url": {"url": _png(pic).url}}]}
        scored = requests.post(f"{server.url}/score", json={"model": "m", "queries": "w1 w2 w3", "documents": [doc]},
                               timeout=60).json()
        cohere = requests.post(f"{server.url}/v2/embed", json={"model": "m", "input_type": "image",
                                                               "images": [_png(pic).url], "embedding_types": ["float"]},
                               timeout=60).json()
        # the cohere SDK unmodified: v4's inputs, text and an image in ONE vector
        import cohere as cohere_sdk

        client = cohere_sdk.ClientV2(api_key="unused", base_url=server.url)
        mixed = client.embed(model="m", input_type="search_document", embedding_types=["float"], inputs=[
            {"content": [{"type": "text", "text": "a photo of w2"},
                         {"type": "image_url", "image_url": {"url": _png(pic).url}}]}])
    render = tiny.tokenizer().apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a photo of w2"}]}], tokenize=False)
    hidden, ids = tiny.reference_hidden(processor, ref, render, [pic])
    want = torch.nn.functional.normalize(hidden[-1], dim=-1).numpy()
    got = np.asarray(chat["data"][0]["embedding"])
    assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) >= 0.9999
    assert chat["usage"]["prompt_tokens"] == len(ids)  # the image's tokens counted
    # Cohere's images: one user message of the image through the chat template
    alone = tiny.tokenizer().apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], tokenize=False)
    hidden, _ = tiny.reference_hidden(processor, ref, alone, [pic])
    want = torch.nn.functional.normalize(hidden[-1], dim=-1).numpy()
    got = np.asarray(cohere["embeddings"]["float"][0])
    assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) >= 0.9999
    # the SDK's mixed input: one user message of its parts, in order, through the chat template
    both = tiny.tokenizer().apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "a photo of w2"}, {"type": "image"}]}], tokenize=False)
    hidden, _ = tiny.reference_hidden(processor, ref, both, [pic])
    want_mixed = torch.nn.functional.normalize(hidden[-1], dim=-1).numpy()
    got = np.asarray(mixed.embeddings.float_[0])
    assert float(got @ want_mixed / np.linalg.norm(got) / np.linalg.norm(want_mixed)) >= 0.9999
    # /score of a text query against an image document (bi-encoder): the cosine of the two vectors
    image_doc = want
    hidden, _ = tiny.reference_hidden(processor, ref, "w1 w2 w3", [])
    query = torch.nn.functional.normalize(hidden[-1], dim=-1).numpy()
    assert scored["data"][0]["score"] == pytest.approx(float(query @ image_doc), abs=1e-4), scored
    for text, row in zip(texts, body["data"], strict=True):
        hidden, ids = tiny.reference_hidden(processor, ref, text, [])
        want = torch.nn.functional.normalize(hidden[-1], dim=-1).numpy()
        got = np.asarray(row["embedding"])
        assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) >= 0.9999
    assert body["usage"]["prompt_tokens"] == sum(len(tiny.reference_hidden(processor, ref, t, [])[1]) for t in texts)
