"""gRPC against a real `poolgate serve --grpc-port` of the bundled all-MiniLM-L6-v2 (a process on loopback): a client
generated from the shipped tei.proto with grpcio-tools calls every RPC the model serves, unary and streaming (10,000
inputs in one EmbedStream), and its vectors equal /v1/embeddings' at cosine 1.0; tritonclient.grpc, unmodified,
gets the same embeddings; health and reflection answer."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests

from poolgate.shared.config.models import DEFAULT_MODEL_NAME
from tests.live_server import live_server
from tests.processes import free_port

PROTOS = Path(__file__).resolve().parents[1] / "gateway" / "grpc"


@pytest.fixture(scope="module")
def tei(tmp_path_factory):
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", f"--python_out={out}",
                    f"--grpc_python_out={out}", "tei.proto"], check=True)
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    with live_server(tmp_path_factory.mktemp("grpc"), "--grpc-port", str(port)) as live:
        yield live.url, f"127.0.0.1:{port}"
    assert live.proc.returncode == 0, live.log_text()[-3000:]


def openai(url: str, texts: list[str]) -> np.ndarray:
    r = requests.post(f"{url}/v1/embeddings", json={"model": DEFAULT_MODEL_NAME, "input": texts}, timeout=120)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float64)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_every_tei_rpc_on_the_real_model(server, tei):
    url, target = server
    pb, rpc = tei
    texts = ["hello world", "poolgate serves pooling models", "a third sentence, a little longer than those"]
    want = openai(url, texts)
    with grpc.insecure_channel(target) as channel:
        embed = rpc.EmbedStub(channel)
        one = embed.Embed(pb.EmbedRequest(inputs=texts[0]))
        assert cosines(one.embeddings, want[0]) == pytest.approx(1.0, abs=1e-6)
        assert one.metadata.compute_tokens == 4 and one.metadata.compute_chars == len(texts[0])
        streamed = [a.embeddings for a in embed.EmbedStream(iter(pb.EmbedRequest(inputs=t) for t in texts))]
        assert np.all(np.abs(cosines(streamed, want) - 1.0) < 1e-6)
        with pytest.raises(grpc.RpcError) as err:  # MiniLM is no matryoshka model: refused, never cut
            embed.Embed(pb.EmbedRequest(inputs=texts[1], dimensions=64))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Matryoshka" in err.value.details()
        tokens = embed.EmbedAll(pb.EmbedAllRequest(inputs=texts[0]))
        assert len(tokens.token_embeddings) == 4 and len(tokens.token_embeddings[0].embeddings) == 384
        assert len(list(embed.EmbedAllStream(iter(pb.EmbedAllRequest(inputs=t) for t in texts)))) == 3
        ranks = rpc.RerankStub(channel).Rerank(pb.RerankRequest(query=texts[0], texts=texts[1:], return_text=True))
        http_ranks = requests.post(f"{url}/rerank", json={"query": texts[0], "texts": texts[1:]}, timeout=60).json()
        assert [r.index for r in ranks.ranks] == [r["index"] for r in http_ranks]
        stream_ranks = rpc.RerankStub(channel).RerankStream(
            iter(pb.RerankStreamRequest(query=texts[0], text=t) for t in texts[1:]))
        assert [r.index for r in stream_ranks.ranks] == [r["index"] for r in http_ranks]
        tok = rpc.TokenizeStub(channel)
        ids = [t.id for t in tok.Tokenize(pb.EncodeRequest(inputs=texts[0], add_special_tokens=True)).tokens]
        assert ids == [101, 7592, 2088, 102]
        assert len(list(tok.TokenizeStream(iter(pb.EncodeRequest(inputs=t) for t in texts)))) == 3
        assert tok.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True)).text == "hello world"
        assert [d.text for d in tok.DecodeStream(iter([pb.DecodeRequest(ids=ids, skip_special_tokens=True)] * 2))] \
            == ["hello world"] * 2
        info = rpc.InfoStub(channel).Info(pb.InfoRequest())
        assert info.model_id == DEFAULT_MODEL_NAME and info.model_type == pb.MODEL_TYPE_EMBEDDING
        for predict in (lambda: rpc.PredictStub(channel).Predict(pb.PredictRequest(inputs="x")),
                        lambda: embed.EmbedSparse(pb.EmbedSparseRequest(inputs="x"))):
            with pytest.raises(grpc.RpcError) as err:  # not what this model does: said, not served wrong
                predict()
            assert err.value.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INVALID_ARGUMENT)


def test_ten_thousand_inputs_in_one_embed_stream(server, tei):
    url, target = server
    pb, rpc = tei
    texts = [f"document {i}: some words about item {i % 97}" for i in range(10_000)]
    with grpc.insecure_channel(target) as channel:
        answers = list(rpc.EmbedStub(channel).EmbedStream(iter(pb.EmbedRequest(inputs=t) for t in texts),
                                                          timeout=600))
    assert len(answers) == 10_000
    picks = [0, 1, 4_999, 7_777, 9_999]
    assert np.all(np.abs(cosines([answers[i].embeddings for i in picks], openai(url, [texts[i] for i in picks]))
                         - 1.0) < 1e-6)
    assert sum(a.metadata.compute_tokens for a in answers) > 10_000


def test_tritonclient_grpc_and_health_on_the_real_model(server):
    import tritonclient.grpc as triton
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    url, target = server
    texts = ["hello world", "poolgate serves pooling models"]
    client = triton.InferenceServerClient(target)
    text = triton.InferInput("text", [len(texts), 1], "BYTES")  # [N, 1], as Triton's embedding ensembles take
    text.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    got = client.infer(DEFAULT_MODEL_NAME, [text]).as_numpy("embeddings")
    assert got.shape == (2, 384)
    assert np.all(np.abs(cosines(got, openai(url, texts)) - 1.0) < 1e-6)
    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == health_pb2.HealthCheckResponse.SERVING
