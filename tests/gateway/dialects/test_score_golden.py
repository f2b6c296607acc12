"""The three scorers on real checkpoints through HTTP, each against its reference.

- cross-encoder: a tiny random BERT classifier with one label (token type 1 on the
  pair's second text), packed and through the transformers fallback, vs
  transformers' ``sigmoid(logit)`` of ``tokenizer(query, text_pair=document)``;
- bi-encoder: the bundled all-MiniLM-L6-v2, /score and /rerank vs the cosine of
  its /v1/embeddings vectors;
- late interaction: the same model with ``token_embed`` as its active task (what
  ``--pooler-config '{"task": "token_embed"}'`` sets), vs a numpy MaxSim over its
  /pooling token vectors.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_cross_encoder
from tests.workers.score_agreement import PAIRS, reference_scores

QUERY = "How do plants make food?"
DOCS = ["Plants make food by photosynthesis, using sunlight, water and carbon dioxide.",
        "The stock market fell sharply on Monday.", "Leaves hold chlorophyll, which captures light.",
        "A recipe for tomato soup."]


def served(path, **cfg):
    return load_model(WorkerConfig(model=str(path), served_model_name="m", dtype="float32", **cfg))


@pytest.fixture(scope="module")
def cross_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cross")
    make_tiny_cross_encoder(folder)
    return folder


@pytest.fixture(scope="module")
def minilm():
    return served(bundled_model_path())


async def post(client, path, body) -> dict:
    resp = await client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


@pytest.mark.parametrize("fallback", [False, True])
async def test_cross_encoder_scores_match_transformers(gateway, cross_folder, monkeypatch, fallback):
    if fallback:  # no packed BERT classifier: transformers' AutoModel, padded
        from poolgate.workers.models import ARCHITECTURES

        monkeypatch.delitem(ARCHITECTURES, "BertForSequenceClassification")
    client = await gateway(models=[served(cross_folder)])
    want = reference_scores(cross_folder, PAIRS)
    one_to_n = await post(client, "/score", {"queries": PAIRS[0][0], "documents": [d for _, d in PAIRS[:15]]})
    pairwise = await post(client, "/v1/score", {"text_1": [q for q, _ in PAIRS[15:]],
                                                "text_2": [d for _, d in PAIRS[15:]]})
    got = [d["score"] for d in one_to_n["data"] + pairwise["data"]]
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    reranked = await post(client, "/rerank", {"query": PAIRS[0][0], "documents": [d for _, d in PAIRS[:15]]})
    order = np.argsort(-want[:15], kind="stable")
    assert [r["index"] for r in reranked["results"]] == order.tolist()
    np.testing.assert_allclose([r["relevance_score"] for r in reranked["results"]], want[:15][order], atol=1e-6)


async def test_bi_encoder_scores_are_cosines_of_the_embeddings(gateway, minilm):
    client = await gateway(models=[minilm])
    vectors = np.array([d["embedding"] for d in (await post(client, "/v1/embeddings",
                                                            {"input": [QUERY, *DOCS]}))["data"]])
    cosines = vectors[1:] @ vectors[0] / (np.linalg.norm(vectors[1:], axis=1) * np.linalg.norm(vectors[0]))
    scored = await post(client, "/score", {"queries": QUERY, "documents": DOCS})
    np.testing.assert_allclose([d["score"] for d in scored["data"]], cosines, atol=1e-6)
    reranked = await post(client, "/v2/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2})
    assert [r["index"] for r in reranked["results"]] == np.argsort(-cosines)[:2].tolist()
    assert reranked["results"][0]["index"] == 0


async def test_late_interaction_scores_are_maxsim_of_the_token_vectors(gateway, minilm):
    # --pooler-config '{"task": "token_embed"}' only puts token_embed first (the active task); the same
    # loaded model serves both, so the module's MiniLM is reused with its tasks in that order.
    model = replace(minilm, info=replace(minilm.info, tasks=("token_embed", "embed")))
    client = await gateway(models=[model])
    pooled = await post(client, "/pooling", {"input": [QUERY, *DOCS], "task": "token_embed"})
    tokens = [np.array(d["data"], dtype=np.float32) for d in pooled["data"]]  # (T, 384) each
    want = [float((tokens[0] @ t.T).max(axis=1).sum()) for t in tokens[1:]]
    scored = await post(client, "/score", {"queries": QUERY, "documents": DOCS})
    np.testing.assert_allclose([d["score"] for d in scored["data"]], want, rtol=1e-5)
    assert scored["usage"]["prompt_tokens"] == pooled["usage"]["prompt_tokens"]  # each text pooled once
