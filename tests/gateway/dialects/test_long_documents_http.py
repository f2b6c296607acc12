"""Long-document rerank (``max_chunks_per_doc``) on /rerank, /v1/rerank, /v2/rerank and /score, per scorer.

The reference is computed here: the document's token windows cut from the
tokenizer's own offsets (window = max_model_len less the query and the special
tokens for a cross-encoder, less the special tokens for a bi-encoder), each
window's text scored as a separate document in a plain request, then folded by
max (default) or mean; the best window's span is the argmax window's.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from transformers import AutoTokenizer

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_cross_encoder

WORDS = [f"w{i}" for i in range(95)]
QUERY = "w1 w2 w3 w4"


def doc(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(5, 95, size=n))


def windows(tokenizer, text: str, size: int, overlap: int, max_windows: int) -> list[tuple[int, int]]:
    """The reference windows: ``size`` content tokens, stride ``size - overlap``, at most ``max_windows``."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) <= size:
        return [(0, len(text))]
    spans = []
    for start in range(0, len(offsets), size - overlap):
        end = min(start + size, len(offsets))
        spans.append((offsets[start][0], offsets[end - 1][1]))
        if end == len(offsets) or len(spans) == max_windows:
            break
    return spans


async def post(client, path, body, status=200) -> dict:
    resp = await client.post(path, json=body)
    assert resp.status == status, await resp.text()
    return await resp.json()


@pytest.fixture(scope="module")
def cross(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cross")
    make_tiny_cross_encoder(folder)
    model = load_model(WorkerConfig(model=str(folder), served_model_name="m", dtype="float32"))
    return model, AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def minilm():
    model = load_model(WorkerConfig(model=str(bundled_model_path()), served_model_name="m", dtype="float32",
                                    max_model_len=40))
    return model, AutoTokenizer.from_pretrained(str(bundled_model_path()))


async def test_cross_encoder_windows_fold_to_the_max_and_mean_of_separate_requests(gateway, cross):
    model, tok = cross
    client = await gateway(models=[model])
    docs = [doc(150, 1), doc(20, 2), doc(300, 3)]
    size = model.info.max_model_len - 3 - len(QUERY.split())  # [CLS] q [SEP] window [SEP]
    for how, path in (("max", "/rerank"), ("mean", "/v2/rerank")):
        body = {"query": QUERY, "documents": docs, "max_chunks_per_doc": 5, "chunk_overlap": 8,
                "chunk_aggregation": how}
        got = await post(client, path, body)
        want_usage = 0
        for result in got["results"]:
            d = docs[result["index"]]
            spans = windows(tok, d, size, 8, 5)
            alone = await post(client, "/score", {"queries": QUERY, "documents": [d[a:b] for a, b in spans]})
            scores = np.array([x["score"] for x in alone["data"]])
            want_usage += alone["usage"]["prompt_tokens"]
            assert result["relevance_score"] == pytest.approx(float(getattr(np, how)(scores)), abs=1e-6)
            k = int(np.argmax(scores))
            assert result["best_chunk"] == {"index": k, "start": spans[k][0], "end": spans[k][1]}
        assert got["usage"]["prompt_tokens"] == want_usage  # every window's tokens
    assert len(windows(tok, docs[2], size, 8, 5)) == 5  # the long one was cut to five windows


async def test_without_the_field_a_long_document_is_still_refused(gateway, cross):
    model, _ = cross
    client = await gateway(models=[model])
    got = await post(client, "/rerank", {"query": QUERY, "documents": [doc(150, 1)]}, status=400)
    assert "maximum context length" in got["error"]["message"]
    short = await post(client, "/score", {"queries": QUERY, "documents": [doc(10, 4)]})
    chunked = await post(client, "/score", {"queries": QUERY, "documents": [doc(10, 4)], "max_chunks_per_doc": 3})
    assert chunked["data"][0]["score"] == short["data"][0]["score"]  # one window: the document itself
    assert "best_chunk" not in short["data"][0] and chunked["data"][0]["best_chunk"]["index"] == 0


async def test_bi_encoder_windows_are_scored_by_their_cosine(gateway, minilm):
    model, tok = minilm
    client = await gateway(models=[model])
    text = ("Plants grow in the garden and the weather is mild this year. " * 8
            + "Photosynthesis turns sunlight, water and carbon dioxide into sugar.")
    query = "How do plants make food?"
    got = await post(client, "/v1/rerank", {"query": query, "documents": [text, "A recipe for soup."],
                                            "max_chunks_per_doc": 8, "chunk_overlap": 5})
    spans = windows(tok, text, model.info.max_model_len - 2, 5, 8)
    embedded = await post(client, "/v1/embeddings", {"input": [query] + [text[a:b] for a, b in spans]})
    vectors = np.array([d["embedding"] for d in embedded["data"]])
    cosines = vectors[1:] @ vectors[0] / (np.linalg.norm(vectors[1:], axis=1) * np.linalg.norm(vectors[0]))
    top = next(r for r in got["results"] if r["index"] == 0)
    assert top["relevance_score"] == pytest.approx(float(cosines.max()), abs=1e-6)
    k = int(np.argmax(cosines))
    assert top["best_chunk"] == {"index": k, "start": spans[k][0], "end": spans[k][1]}


async def test_late_interaction_windows_are_scored_by_maxsim(gateway, minilm):
    model, tok = minilm
    client = await gateway(models=[replace(model, info=replace(model.info, tasks=("token_embed", "embed")))])
    text = "The sun warms the sea. " * 12 + "Leaves hold chlorophyll."
    got = await post(client, "/score", {"queries": "chlorophyll in leaves", "documents": [text],
                                        "max_chunks_per_doc": 10})
    spans = windows(tok, text, model.info.max_model_len - 2, 0, 10)
    pooled = await post(client, "/pooling", {"input": ["chlorophyll in leaves"] + [text[a:b] for a, b in spans],
                                             "task": "token_embed"})
    tokens = [np.array(d["data"], dtype=np.float32) for d in pooled["data"]]
    want = [float((tokens[0] @ t.T).max(axis=1).sum()) for t in tokens[1:]]
    assert got["data"][0]["score"] == pytest.approx(max(want), rel=1e-5)
    assert got["usage"]["prompt_tokens"] == pooled["usage"]["prompt_tokens"]


@pytest.mark.parametrize("fields,message", [
    ({"max_chunks_per_doc": 0}, "max_chunks_per_doc must be at least 1, got 0."),
    ({"max_chunks_per_doc": 2, "chunk_overlap": -1}, "chunk_overlap must be a non-negative integer"),
    ({"max_chunks_per_doc": 2, "chunk_overlap": 64}, "chunk_overlap (64) must be smaller than the window"),
    ({"max_chunks_per_doc": 2, "chunk_overlap": 57}, "chunk_overlap (57) must be smaller than the window (57 tokens"),
    ({"max_chunks_per_doc": 2, "chunk_aggregation": "median"}, "chunk_aggregation must be one of max, mean"),
])
async def test_bad_window_fields_are_400s(gateway, cross, fields, message):
    model, _ = cross
    client = await gateway(models=[model])
    for path in ("/rerank", "/v2/rerank"):
        got = await post(client, path, {"query": QUERY, "documents": [doc(100, 5)], **fields}, status=400)
        text = got["error"]["message"] if "error" in got else got["message"]
        assert message in text
