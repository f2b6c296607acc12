"""POST /rerank, /v1/rerank and /v2/rerank (vLLM / Jina shape plus Cohere's meta), and the Cohere SDK's
``ClientV2.rerank`` against a live gateway."""
from __future__ import annotations

import contextlib

import cohere
import numpy as np
import pytest

from poolgate.gateway.app import make_app
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import fake_ids, fake_model, fake_pair_ids, fake_probs, fake_vector
from tests.gateway.conftest import served_router
from tests.gateway.dialects.test_score_http import cross_encoder, score

QUERY = "what is the capital of france"
DOCS = ["paris is the capital", "bananas are yellow", "the capital of france is paris", "x"]


def cross_scores(query: str, docs: list[str]) -> list[float]:
    return [float(fake_probs(fake_pair_ids(query, d)[0], 1)[0]) for d in docs]


async def rerank(client, body, path="/rerank", status=200) -> dict:
    return await score(client, body, path, status)  # the same answer checks as /score's


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_results_sorted_by_score_with_index_and_document(gateway, path):
    client = await gateway(models=[cross_encoder()])
    body = await rerank(client, {"model": "fake-model", "query": QUERY, "documents": DOCS}, path)
    scores = cross_scores(QUERY, DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    assert [r["index"] for r in body["results"]] == order
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(scores[r["index"]], rel=1e-6)
        assert r["document"] == {"text": DOCS[r["index"]], "multi_modal": None}
    tokens = sum(len(fake_pair_ids(QUERY, d)[0]) for d in DOCS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert body["model"] == "fake-model"
    assert body["meta"] == {"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
                            "tokens": {"input_tokens": tokens}}


async def test_top_n_and_return_documents(gateway):
    client = await gateway(models=[cross_encoder()])
    full = await rerank(client, {"query": QUERY, "documents": DOCS})
    top = await rerank(client, {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": False})
    assert [r["index"] for r in top["results"]] == [r["index"] for r in full["results"][:2]]
    assert all("document" not in r for r in top["results"])
    everything = await rerank(client, {"query": QUERY, "documents": DOCS, "top_n": 0})
    assert len(everything["results"]) == len(DOCS)
    more = await rerank(client, {"query": QUERY, "documents": DOCS, "top_n": 50})
    assert len(more["results"]) == len(DOCS)


async def test_jina_document_objects_and_a_single_document(gateway):
    client = await gateway(models=[cross_encoder()])
    body = await rerank(client, {"query": "a", "documents": [{"text": "b c"}, "d"]}, "/v1/rerank")
    assert {r["document"]["text"] for r in body["results"]} == {"b c", "d"}
    one = await rerank(client, {"query": "a", "documents": "b"})
    assert one["results"][0]["relevance_score"] == pytest.approx(cross_scores("a", ["b"])[0], rel=1e-6)


async def test_a_bi_encoder_reranks_by_cosine(gateway):
    client = await gateway(models=[fake_model(tasks=("embed",))])
    body = await rerank(client, {"query": QUERY, "documents": DOCS})
    q = fake_vector(fake_ids(QUERY))
    cosines = [float(q @ fake_vector(fake_ids(d))) for d in DOCS]  # fake vectors are unit norm
    assert [r["index"] for r in body["results"]] == sorted(range(len(DOCS)), key=lambda i: -cosines[i])
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(cosines[r["index"]], rel=1e-5)


@pytest.mark.parametrize("body,message", [
    ({"query": "a", "documents": []}, "At least one text_pair element must be given"),
    ({"query": "a", "documents": ["b"], "top_n": -1}, "greater than or equal to 0"),
    ({"query": "a", "documents": ["b"], "max_tokens_per_doc": 40}, "must be less than max_model_len (32)"),
    ({"documents": ["b"]}, "query"),
])
async def test_errors(gateway, body, message):
    client = await gateway(models=[cross_encoder()])
    vllm = await rerank(client, body, "/rerank", status=400)
    assert message in vllm["error"]["message"]
    cohere_shaped = await rerank(client, body, "/v2/rerank", status=400)
    assert message in cohere_shaped["message"] and "error" not in cohere_shaped


@pytest.fixture
async def cohere_client(live_server):
    """``await cohere_client(model)`` -> a cohere.AsyncClientV2 on a fresh app over one real worker."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(model) -> cohere.AsyncClientV2:
            router = await stack.enter_async_context(served_router([model]))
            base_url = await live_server(make_app(GatewayConfig(), router))
            return cohere.AsyncClientV2(api_key="x", base_url=base_url)

        yield start


async def test_the_cohere_sdk_parses_v2_rerank(cohere_client):
    client = await cohere_client(cross_encoder())
    resp = await client.rerank(model="fake-model", query=QUERY, documents=DOCS, top_n=3)
    scores = cross_scores(QUERY, DOCS)
    assert [r.index for r in resp.results] == sorted(range(len(DOCS)), key=lambda i: -scores[i])[:3]
    assert [r.relevance_score for r in resp.results] == pytest.approx([scores[r.index] for r in resp.results],
                                                                       rel=1e-6)
    assert resp.meta.api_version.version == "2" and resp.meta.billed_units.search_units == 1
    assert resp.id.startswith("score-")
    with pytest.raises(cohere.BadRequestError):
        await client.rerank(model="fake-model", query=QUERY, documents=[])
    np.testing.assert_array_equal(sorted(r.relevance_score for r in resp.results)[::-1],
                                  [r.relevance_score for r in resp.results])
