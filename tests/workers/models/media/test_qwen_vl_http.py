"""A tiny jina-reranker-m0 and a tiny Qwen2-VL embedder served by ``poolgate serve`` (gateway, transport, worker):
the media plan is built in the gateway from the tokenizer files the worker sent, and its answers equal
transformers' reference over HTTP. (Image parts over HTTP arrive with the dialects' parsing.)"""

from __future__ import annotations

import numpy as np
import pytest
import requests
import torch

from tests.live_server import live_server
from tests.workers.models.media import qwen_vl_tiny as tiny
from tests.workers.models.media.test_qwen_vl import _jina_reference, _make_reranker

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


def test_embeddings_over_http(tmp_path):
    model = tmp_path / "qwen2_vl"
    processor, ref = tiny.make(model)
    texts = ["w1 w2 w3", "a photo of w7"]
    with live_server(tmp_path, str(model), "--served-model-name", "m", "--dtype", "float32") as server:
        body = requests.post(f"{server.url}/v1/embeddings", json={"model": "m", "input": texts}, timeout=60).json()
    for text, row in zip(texts, body["data"], strict=True):
        hidden, ids = tiny.reference_hidden(processor, ref, text, [])
        want = torch.nn.functional.normalize(hidden[-1], dim=-1).numpy()
        got = np.asarray(row["embedding"])
        assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) >= 0.9999
    assert body["usage"]["prompt_tokens"] == sum(len(tiny.reference_hidden(processor, ref, t, [])[1]) for t in texts)
