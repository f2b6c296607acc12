"""Late chunking on /v1/embeddings against a reference built here from /pooling token vectors.

The reference: the document's raw token vectors (/pooling, token_embed, use_activation false), the
tokenizer's own offsets (transformers), each chunk the tokens whose first character lies in it, their
mean, normalized.
"""
from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.workers.load.build import load_model
from tests.fakes import fake_model

DOC = ("Berlin is the capital of Germany. It has about 3.8 million inhabitants. "
       "The city is known for its museums, and its zoo is the oldest in the country.")
STARTS = [0, DOC.index("It has"), DOC.index("The city")]


@pytest.fixture(scope="module")
def minilm():
    path = str(bundled_model_path())
    return load_model(WorkerConfig(model=path, served_model_name="m", dtype="float32")), \
        AutoTokenizer.from_pretrained(path)


async def post(client, path, body, status=200):
    resp = await client.post(path, json=body)
    out = await resp.json()
    assert resp.status == status, out
    return out


async def reference(client, tok, text: str, spans: list[tuple[int, int]]) -> np.ndarray:
    pooled = await post(client, "/pooling", {"input": text, "task": "token_embed", "use_activation": False})
    tokens = np.array(pooled["data"][0]["data"], dtype=np.float64)  # (T, 384)
    offsets = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    starts = [o[0] if not special else -1 for o, special in zip(offsets["offset_mapping"],
                                                                 offsets["special_tokens_mask"])]
    out = []
    for a, b in spans:
        mean = tokens[[i for i, s in enumerate(starts) if a <= s < b]].mean(0)
        out.append(mean / np.linalg.norm(mean))
    return np.array(out)


def cosines(got: dict, want: np.ndarray) -> np.ndarray:
    vectors = np.array([d["embedding"] for d in got["data"]], dtype=np.float64)
    return (vectors * want).sum(1) / np.linalg.norm(vectors, axis=1)


async def test_chunk_boundaries_are_the_mean_of_each_chunks_token_vectors(gateway, minilm):
    model, tok = minilm
    client = await gateway(models=[model])
    got = await post(client, "/v1/embeddings", {"input": DOC, "late_chunking": True, "chunk_boundaries": STARTS})
    spans = list(zip(STARTS, [*STARTS[1:], len(DOC)]))
    assert [(d["chunk"]["start"], d["chunk"]["end"]) for d in got["data"]] == spans
    assert cosines(got, await reference(client, tok, DOC, spans)).min() >= 0.99999
    plain = await post(client, "/v1/embeddings", {"input": [DOC[a:b] for a, b in spans]})
    assert got["usage"]["prompt_tokens"] == len(tok(DOC)["input_ids"])  # the document, once
    alone = np.array([d["embedding"] for d in plain["data"]])
    assert not np.allclose(alone, [d["embedding"] for d in got["data"]], atol=1e-3)  # context changed them


async def test_jinas_form_joins_the_inputs_into_one_document(gateway, minilm):
    model, tok = minilm
    client = await gateway(models=[model])
    chunks = ["Berlin is the capital of Germany.", "It has about 3.8 million inhabitants."]
    got = await post(client, "/v1/embeddings", {"input": chunks, "late_chunking": True})
    doc = " ".join(chunks)
    spans = [(0, len(chunks[0])), (len(chunks[0]) + 1, len(doc))]
    assert [d["index"] for d in got["data"]] == [0, 1]
    assert [(d["chunk"]["start"], d["chunk"]["end"]) for d in got["data"]] == [(0, spans[1][0]), (spans[1][0], len(doc))]
    assert cosines(got, await reference(client, tok, doc, spans)).min() >= 0.99999


async def test_chunk_size_chunks_every_document(gateway, minilm):
    model, tok = minilm
    client = await gateway(models=[model])
    docs = [DOC, "A short one about the zoo."]
    got = await post(client, "/v1/embeddings", {"input": docs, "late_chunking": True, "chunk_size": 6})
    for d, text in enumerate(docs):
        items = [x for x in got["data"] if x["chunk"]["document"] == d]
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        assert len(items) == -(-len(offsets) // 6)
        spans = [(offsets[a][0], offsets[min(a + 6, len(offsets)) - 1][1]) for a in range(0, len(offsets), 6)]
        assert [(x["chunk"]["start"], x["chunk"]["end"]) for x in items] == spans
        want = await reference(client, tok, text, spans)
        assert cosines({"data": items}, want).min() >= 0.99999


@pytest.mark.parametrize("body,message", [
    ({"chunk_boundaries": [0, 40, 20]}, "chunk_boundaries must be strictly increasing"),
    ({"chunk_boundaries": [0, 5000]}, "chunk_boundaries must lie inside the document"),
    ({"chunk_boundaries": [0, 1, 2]}, "chunk 1 (characters 1 to 2) holds no token"),
    ({"chunk_size": 0}, "chunk_size must be a positive integer"),
    ({"chunk_size": 4, "chunk_boundaries": [0]}, "not both"),
    ({"late_chunking": False, "chunk_size": 4}, "need late_chunking: true"),
    ({"dimensions": 8}, "dimensions does not apply"),
    ({"input_type": "search_query"}, "do not combine with late chunking"),
])
async def test_bad_late_chunking_requests_are_400s(gateway, minilm, body, message):
    model, _ = minilm
    client = await gateway(models=[model])
    out = await post(client, "/v1/embeddings", {"input": DOC, "late_chunking": True, **body}, status=400)
    assert message in out["error"]["message"]


async def test_a_model_without_token_vectors_refuses_late_chunking(gateway):
    client = await gateway(models=[fake_model(tasks=("embed",))])
    out = await post(client, "/v1/embeddings", {"input": "a b", "late_chunking": True, "chunk_size": 1}, status=400)
    assert "needs the model's token vectors" in out["error"]["message"]
    out = await post(client, "/v1/embeddings", {"input": [[5, 6]], "late_chunking": True}, status=400)
    assert "late chunking reads texts" in out["error"]["message"]
