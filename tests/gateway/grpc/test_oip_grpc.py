"""The Open Inference Protocol over gRPC with tritonclient's own client, unmodified (tritonclient.grpc.aio on the
server's loop): embeddings equal /v1/embeddings', reranker scores equal /rerank's, health and metadata answer, and
bad calls get the status the one table gives."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import fake_model

TEXTS = ["a first text", "the second one", "and a third, longer than the others"]


def texts_input(name: str, texts: list[str]) -> triton.InferInput:
    tensor = triton.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    return tensor


async def http_json(served, path, body):
    resp = await served.http.post(path, json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_embeddings_and_health_with_tritonclient(grpc_gateway):
    served = await grpc_gateway(models=[fake_model(name="org/embedder")])
    client = triton.InferenceServerClient(f"127.0.0.1:{served.port}")
    try:
        assert await client.is_server_live() and await client.is_server_ready()
        assert await client.is_model_ready("org/embedder") and not await client.is_model_ready("nope")
        meta = await client.get_server_metadata()
        assert meta.name == "poolgate"
        model = await client.get_model_metadata("org/embedder")
        assert [(t.name, t.datatype) for t in model.inputs] == [("text", "BYTES")]
        assert [(t.name, t.datatype, list(t.shape)) for t in model.outputs] == [("embeddings", "FP32", [-1, 8])]
        result = await client.infer("org/embedder", [texts_input("text", TEXTS)], request_id="r-1")
        got = result.as_numpy("embeddings")
        assert result.get_response().id == "r-1" and got.shape == (3, 8) and got.dtype == np.float32
        want = (await http_json(served, "/v1/embeddings", {"input": TEXTS}))["data"]
        np.testing.assert_allclose(got, np.float32([d["embedding"] for d in want]), rtol=1e-6, atol=1e-7)
        raw = await client.infer("org/embedder", [texts_input("text", TEXTS[:1])], parameters={"normalize": False},
                                 outputs=[triton.InferRequestedOutput("embeddings")])
        http_raw = await http_json(served, "/embed", {"inputs": TEXTS[0], "normalize": False})
        np.testing.assert_allclose(raw.as_numpy("embeddings")[0], http_raw[0], rtol=1e-6)
    finally:
        await client.close()


async def test_rerank_scores_with_tritonclient(grpc_gateway):
    served = await grpc_gateway(models=[fake_model(name="ranker", tasks=("classify",), num_labels=1, dim=1)])
    client = triton.InferenceServerClient(f"127.0.0.1:{served.port}")
    try:
        result = await client.infer("ranker", [texts_input("query", ["q"]), texts_input("documents", TEXTS)])
        scores = result.as_numpy("scores")
        want = await http_json(served, "/rerank", {"query": "q", "documents": TEXTS})
        by_index = {r["index"]: r["relevance_score"] for r in want["results"]}
        np.testing.assert_allclose(scores, [by_index[i] for i in range(3)], rtol=1e-6)
    finally:
        await client.close()


async def test_bad_calls_get_their_status(grpc_gateway):
    served = await grpc_gateway(models=[fake_model()], config=GatewayConfig(api_key="sesame"))
    client = triton.InferenceServerClient(f"127.0.0.1:{served.port}")
    key = {"authorization": "Bearer sesame"}
    try:
        assert await client.is_server_live()  # health needs no key
        with pytest.raises(InferenceServerException) as err:
            await client.infer("fake-model", [texts_input("text", TEXTS)])
        assert err.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(InferenceServerException) as err:
            await client.infer("nope", [texts_input("text", TEXTS)], headers=key)
        assert err.value.status() == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException) as err:
            await client.infer("fake-model", [texts_input("wrong", TEXTS)], headers=key)
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "unknown input 'wrong'" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            await client.infer("fake-model", [texts_input("text", TEXTS)], headers=key, parameters={"colour": "red"})
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "colour" in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            await client.get_model_config("fake-model", headers=key)
        assert err.value.status() == "StatusCode.UNIMPLEMENTED"
        ok = await client.infer("fake-model", [texts_input("text", TEXTS)], headers=key)
        assert ok.as_numpy("embeddings").shape == (3, 8)
    finally:
        await client.close()
