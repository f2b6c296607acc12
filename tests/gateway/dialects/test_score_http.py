"""POST /score and /v1/score with each scorer (fake cross-, bi- and late-interaction models) and every pair form."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.scoring import maxsim
from tests.fakes import fake_ids, fake_model, fake_output, fake_pair_ids, fake_probs, fake_vector

PAIR_FORMS = [("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2")]
DOCS = ["paris is the capital", "bananas are yellow", "the capital of france"]
QUERY = "what is the capital of france"


def cross_encoder(**kw):
    return fake_model(tasks=("classify",), num_labels=1, dim=1, **kw)


def bi_encoder(**kw):
    return fake_model(tasks=("embed", "token_embed"), **kw)


def late_interaction(**kw):
    return fake_model(tasks=("token_embed", "embed"), **kw)


def cross_score(q: str, d: str, **params) -> float:
    return float(fake_probs(fake_pair_ids(q, d)[0], 1, **params)[0])


def cosine(q: str, d: str) -> float:
    a, b = fake_vector(fake_ids(q)), fake_vector(fake_ids(d))
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def late_score(q: str, d: str) -> float:
    params = PoolingParams(task="token_embed")
    return maxsim(fake_output(fake_ids(q), params), fake_output(fake_ids(d), params))


async def score(client, body, path="/score", status=200) -> dict:
    resp = await client.post(path, json=body)
    assert resp.status == status, await resp.text()
    out = await resp.json()
    if status == 200:
        assert out["id"] == f"score-{resp.headers['X-Request-Id']}"
    return out


@pytest.mark.parametrize("first,second", PAIR_FORMS)
async def test_every_pair_form_scores_one_to_n_with_a_cross_encoder(gateway, first, second):
    client = await gateway(models=[cross_encoder()])
    body = await score(client, {"model": "fake-model", first: QUERY, second: DOCS})
    assert body["object"] == "list" and body["model"] == "fake-model" and isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"score"}
    np.testing.assert_allclose([d["score"] for d in body["data"]], [cross_score(QUERY, d) for d in DOCS],
                               rtol=1e-6)
    tokens = sum(len(fake_pair_ids(QUERY, d)[0]) for d in DOCS)  # per pair, as vLLM counts a cross-encoder
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                             "prompt_tokens_details": None, "completion_tokens_details": None}


async def test_cross_encoder_pairs_carry_token_type_ids_into_the_batch(gateway):
    model = cross_encoder()
    client = await gateway(models=[model])
    await score(client, {"text_1": ["a b", "c"], "text_2": ["d", "e f"]}, "/v1/score")
    seqs = [s for batch in model.runner.batches for s in batch]
    assert [s.token_ids for s in seqs] == [fake_pair_ids("a b", "d")[0], fake_pair_ids("c", "e f")[0]]
    assert [s.token_type_ids for s in seqs] == [fake_pair_ids("a b", "d")[1], fake_pair_ids("c", "e f")[1]]


async def test_one_to_one_and_n_to_n(gateway):
    client = await gateway(models=[cross_encoder()])
    one = await score(client, {"text_1": "a b", "text_2": "c d"})
    assert [d["score"] for d in one["data"]] == pytest.approx([cross_score("a b", "c d")], rel=1e-6)
    many = await score(client, {"queries": ["a", "b"], "documents": ["c", "d"]})
    assert [d["score"] for d in many["data"]] == pytest.approx([cross_score("a", "c"), cross_score("b", "d")],
                                                                rel=1e-6)


async def test_use_activation_false_gives_the_raw_logit(gateway):
    client = await gateway(models=[cross_encoder()])
    body = await score(client, {"queries": "a", "documents": "b", "use_activation": False})
    assert body["data"][0]["score"] == pytest.approx(cross_score("a", "b", use_activation=False), rel=1e-6)


async def test_bi_encoder_scores_are_cosines_and_each_text_is_pooled_once(gateway):
    model = bi_encoder()
    client = await gateway(models=[model])
    body = await score(client, {"queries": QUERY, "documents": DOCS})
    np.testing.assert_allclose([d["score"] for d in body["data"]], [cosine(QUERY, d) for d in DOCS], rtol=1e-5)
    seqs = [s.token_ids for batch in model.runner.batches for s in batch]
    assert seqs == [fake_ids(QUERY)] + [fake_ids(d) for d in DOCS]  # the query embedded once
    tokens = sum(len(s) for s in seqs)
    assert body["usage"]["prompt_tokens"] == tokens


async def test_late_interaction_scores_are_maxsim(gateway):
    client = await gateway(models=[late_interaction()])
    body = await score(client, {"queries": [QUERY, "x y"], "documents": DOCS[:2]})
    np.testing.assert_allclose([d["score"] for d in body["data"]],
                               [late_score(QUERY, DOCS[0]), late_score("x y", DOCS[1])], rtol=1e-5)


async def test_max_tokens_per_query_and_doc_cut_each_side(gateway):
    model = cross_encoder(max_model_len=32)
    client = await gateway(models=[model])
    body = await score(client, {"queries": "a b c d", "documents": "e f g", "max_tokens_per_query": 2,
                                "max_tokens_per_doc": 1})
    assert body["data"][0]["score"] == pytest.approx(cross_score("a b", "e"), rel=1e-6)
    bi = bi_encoder()
    client = await gateway(models=[bi])
    body = await score(client, {"queries": "a b c d", "documents": ["e f g", "h"], "max_tokens_per_doc": 1})
    assert [s.token_ids for b in bi.runner.batches for s in b] == [fake_ids("a b c d"), fake_ids("e"),
                                                                    fake_ids("h")]
    assert body["data"][0]["score"] == pytest.approx(cosine("a b c d", "e"), rel=1e-5)


@pytest.mark.parametrize("body,message", [
    ({"queries": ["a", "b"], "documents": ["c", "d", "e"]}, "Input lengths must be either 1:1, 1:N or N:N"),
    ({"queries": [], "documents": ["c"]}, "At least one text element must be given"),
    ({"queries": "a", "documents": []}, "At least one text_pair element must be given"),
    ({"queries": "a", "documents": "b", "max_tokens_per_doc": 32},
     "max_tokens_per_doc (32) must be less than max_model_len (32)."),
    ({"queries": "a", "documents": "b", "max_tokens_per_query": -1}, "greater than or equal to 0"),
    ({"queries": "a"}, "a score request needs one pair of inputs"),
    ({"queries": "a", "documents": {"content": [{"type": "image_url"}]}},
     "documents[0].content[0]: an image_url part needs its URL"),
    ({"queries": "a", "documents": {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}},
     "model 'fake-model' reads text only; an input holds image"),
    ({"queries": {"content": [{"type": "text", "text": "q"}, {"type": "image_url", "image_url": "data:,"}]},
      "documents": "b"}, "a cross-encoder's query with images is one text or one image"),
    ({"queries": "a", "documents": {"content": [{"type": "video_url", "video_url": {"url": "x"}}]}},
     "documents[0].content[0]: video is not served"),
    ({"queries": "a", "documents": {"content": []}}, "documents[0]: a content list needs at least one part"),
    ({"queries": "a", "documents": "b", "normalize": True}, "Parameter `normalize` was removed"),
    ({"queries": "a", "documents": "b", "truncate_prompt_tokens": 64}, "truncate_prompt_tokens value is greater"),
])
async def test_errors_are_vllm_400s(gateway, body, message):
    client = await gateway(models=[cross_encoder()])
    out = await score(client, body, status=400)
    assert message in out["error"]["message"]


async def test_a_too_long_pair_is_refused(gateway):
    client = await gateway(models=[cross_encoder(max_model_len=6)])
    out = await score(client, {"queries": "a b c", "documents": "d e f"}, status=400)
    assert "maximum context length is 6 tokens" in out["error"]["message"]
    ok = await score(client, {"queries": "a b c", "documents": "d e f", "truncate_prompt_tokens": 6})
    assert ok["usage"]["prompt_tokens"] == 6


@pytest.mark.parametrize("model", [
    fake_model(tasks=("classify",), num_labels=3, dim=3),  # more than one label: no scoring
    fake_model(tasks=("token_classify",)),
])
async def test_models_that_cannot_score_have_no_score_route(gateway, model):
    client = await gateway(models=[model])
    for path in ("/score", "/v1/score", "/rerank", "/v2/rerank"):
        resp = await client.post(path, json={"queries": "a", "documents": "b", "query": "a"})
        assert resp.status == 404, path


async def test_a_named_model_that_cannot_score_gets_vllms_unsupported_task(gateway):
    client = await gateway(models=[fake_model(name="emb"), fake_model(name="ner", tasks=("token_classify",))])
    for path, body in (("/score", {"queries": "a", "documents": "b"}), ("/rerank", {"query": "a", "documents": ["b"]})):
        resp = await client.post(path, json={**body, "model": "ner"})
        assert resp.status == 400, path
        operation = path.strip("/")
        assert (await resp.json())["error"]["message"] == (
            f"Unsupported task: '{operation}' Supported tasks: ('token_classify',)")
        resp = await client.post(path, json={**body, "model": "emb"})
        assert resp.status == 200, path


async def test_the_instruction_travels_with_each_pair(gateway):
    model = cross_encoder()
    client = await gateway(models=[model])
    await score(client, {"queries": "a", "documents": ["b", "c"], "instruction": "find it"})
    await score(client, {"queries": "a", "documents": "b", "chat_template_kwargs": {"instruct": "other"}})
    await score(client, {"queries": "a", "documents": "b"})
    calls = model.encoder.pair_calls
    assert [[p.instruction for p in call] for call in calls] == [["find it", "find it"], ["other"], [None]]
