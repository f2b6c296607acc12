"""The Open Inference Protocol's REST routes with tritonclient.http, unmodified, against the app on a real TCP port
and real workers around the fake models: binary tensors both ways (its defaults) and JSON both ways give the
vectors of /v1/embeddings, the scores of /rerank and the probabilities of /classify; health, metadata and
Triton's routes; bad requests answer the protocol's {"error"} with their status. tritonclient is synchronous
(gevent), so each call runs in a thread while the event loop serves it."""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from poolgate.gateway.dialects.oip_models import infer
from poolgate.gateway.dialects.oip_tensors import from_data
from poolgate.gateway.http.state import REQUEST_ID
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import InvalidRequest
from tests.fakes import expected_output, fake_model
from tests.gateway.dialects.test_score_http import cross_encoder

TEXTS = ["hello world", "a b c", "the third text"]
LABELS = ("negative", "neutral", "positive")


class Triton:
    """A tritonclient.http client of the test gateway. gevent binds its sockets to the thread that made them,
    so the client is made and called in one thread of its own."""

    def __init__(self, client, headers: dict | None = None):
        self.client = client  # the aiohttp TestClient (for the other dialects' answers)
        self.headers = headers
        self.thread = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.triton = self.thread.submit(http.InferenceServerClient, f"{client.host}:{client.port}").result()

    async def __call__(self, method: str, *args, **kwargs):
        call = functools.partial(getattr(self.triton, method), *args, headers=self.headers, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.thread, call)

    def close(self) -> None:
        self.thread.submit(self._drop).result()  # its __del__ closes it again: in its own thread
        self.thread.shutdown()

    def _drop(self) -> None:
        self.triton.close()
        del self.triton


@pytest.fixture
async def triton(gateway):
    """``await triton(models=..., config=..., headers=...)`` -> a ``Triton`` over a fresh gateway."""
    made: list[Triton] = []

    async def start(headers: dict | None = None, **kw) -> Triton:
        made.append(Triton(await gateway(**kw), headers))
        return made[-1]

    yield start
    for t in made:
        t.close()


def texts_input(name: str, texts: list[str], *, binary: bool = True, column: bool = False) -> http.InferInput:
    data = np.array([t.encode() for t in texts], dtype=object)
    data = data.reshape(-1, 1) if column else data
    return http.InferInput(name, list(data.shape), "BYTES").set_data_from_numpy(data, binary_data=binary)


async def openai_vectors(client, texts, **fields) -> np.ndarray:
    resp = await client.post("/v1/embeddings", json={"input": texts, **fields})
    assert resp.status == 200, await resp.text()
    return np.float32([d["embedding"] for d in (await resp.json())["data"]])


async def test_tritonclients_defaults_binary_both_ways_give_the_openai_vectors(triton):
    t = await triton()
    result = await t("infer", "fake-model", [texts_input("text", TEXTS)])
    got = result.as_numpy("embeddings")
    want = await openai_vectors(t.client, TEXTS)
    assert got.dtype == np.float32 and got.shape == (3, 8)
    assert np.array_equal(got, want)
    response = result.get_response()
    assert response["model_name"] == "fake-model" and response["model_version"] == "1"
    assert response["outputs"][0]["parameters"] == {"binary_data_size": 3 * 8 * 4}  # no JSON data: binary
    assert "data" not in response["outputs"][0]


async def test_json_both_ways_the_request_id_and_a_column_of_texts(triton):
    t = await triton()
    inputs = [texts_input("text", TEXTS, binary=False, column=True)]  # shape [3, 1], as Triton ensembles send
    outputs = [http.InferRequestedOutput("embeddings", binary_data=False)]
    result = await t("infer", "fake-model", inputs, outputs=outputs, request_id="req-7")
    response = result.get_response()
    assert response["id"] == "req-7" and len(response["outputs"][0]["data"]) == 24
    assert np.array_equal(result.as_numpy("embeddings"), await openai_vectors(t.client, TEXTS))
    again = await t("infer", "fake-model", inputs, model_version="1")
    assert np.array_equal(again.as_numpy("embeddings"), result.as_numpy("embeddings"))


async def test_embedding_parameters(triton):
    t = await triton(models=[fake_model(matryoshka=True)])
    raw = await t("infer", "fake-model", [texts_input("text", TEXTS)], parameters={"normalize": False})
    unnormalized = np.stack([expected_output(x, use_activation=False) for x in TEXTS])
    assert np.array_equal(raw.as_numpy("embeddings"), unnormalized)
    cut = await t("infer", "fake-model", [texts_input("text", TEXTS)], parameters={"dimensions": 4, "truncate": True})
    assert np.array_equal(cut.as_numpy("embeddings"), await openai_vectors(t.client, TEXTS, dimensions=4))
    meta = await t("get_model_metadata", "fake-model")
    assert meta["outputs"] == [{"name": "embeddings", "datatype": "FP32", "shape": [-1, -1]}]  # matryoshka: any D


async def test_rerank_scores_are_reranks_relevance_scores_in_document_order(triton):
    t = await triton(models=[cross_encoder()])
    docs = ["doc one", "a second doc", "x", "and a fourth one"]
    for binary in (True, False):
        inputs = [texts_input("query", ["what is it"], binary=binary), texts_input("documents", docs, binary=binary)]
        outputs = [http.InferRequestedOutput("scores", binary_data=binary)]
        scores = (await t("infer", "fake-model", inputs, outputs=outputs)).as_numpy("scores")
        resp = await t.client.post("/rerank", json={"query": "what is it", "documents": docs})
        by_index = {r["index"]: r["relevance_score"] for r in (await resp.json())["results"]}
        assert scores.dtype == np.float32 and scores.shape == (4,)
        assert scores.tolist() == np.float32([by_index[i] for i in range(4)]).tolist()
    raw = await t("infer", "fake-model", inputs, parameters={"raw_scores": True})
    assert not np.allclose(raw.as_numpy("scores"), scores)
    await refused(t, "400", "missing input 'query'", "fake-model", [texts_input("documents", docs)])
    await refused(t, "400", "input 'query' is BYTES of shape [1] or [1, 1]", "fake-model",
                  [texts_input("query", ["a", "b"]), texts_input("documents", docs)])
    meta = await t("get_model_metadata", "fake-model")
    assert [i["name"] for i in meta["inputs"]] == ["query", "documents"] and meta["outputs"][0]["name"] == "scores"


async def test_classifier_probabilities_and_labels(triton):
    t = await triton(models=[fake_model(tasks=("classify",), labels=LABELS, dim=3)])
    result = await t("infer", "fake-model", [texts_input("text", TEXTS[:2])])
    probs = result.as_numpy("probabilities")
    want = np.stack([expected_output(x, "classify", num_labels=3) for x in TEXTS[:2]])
    assert np.array_equal(probs, want)
    assert result.as_numpy("labels").tolist() == [LABELS[int(np.argmax(p))].encode() for p in want]
    only = await t("infer", "fake-model", [texts_input("text", TEXTS[:2], binary=False)],
                   outputs=[http.InferRequestedOutput("labels", binary_data=False)])
    assert [o["name"] for o in only.get_response()["outputs"]] == ["labels"]
    assert only.as_numpy("labels").tolist() == [LABELS[int(np.argmax(p))] for p in want]  # JSON: strings


async def test_health_metadata_and_tritons_routes(triton):
    t = await triton(models=[fake_model(), cross_encoder(name="ranker")])
    assert await t("is_server_live") and await t("is_server_ready")
    assert await t("is_model_ready", "fake-model") and await t("is_model_ready", "ranker", "1")
    assert not await t("is_model_ready", "fake-model", "2") and not await t("is_model_ready", "nope")
    server = await t("get_server_metadata")
    assert server["name"] == "poolgate" and server["extensions"] == ["binary_tensor_data"] and server["version"]
    meta = await t("get_model_metadata", "fake-model", "1")
    assert meta == {"name": "fake-model", "versions": ["1"], "platform": "poolgate",
                    "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
                    "outputs": [{"name": "embeddings", "datatype": "FP32", "shape": [-1, 8]}]}
    config = await t("get_model_config", "ranker")
    assert config["input"][1] == {"name": "documents", "data_type": "TYPE_STRING", "dims": [-1]}
    index = await t("get_model_repository_index")
    assert {(m["name"], m["state"]) for m in index} == {("fake-model", "READY"), ("ranker", "READY")}
    for call, args in (("get_model_metadata", ("nope",)), ("get_model_metadata", ("fake-model", "2")),
                       ("get_inference_statistics", ("fake-model",)), ("get_system_shared_memory_status", ()),
                       ("load_model", ("x",))):
        with pytest.raises(InferenceServerException) as err:
            await t(call, *args)
        assert err.value.status() == "404" and isinstance(err.value.message(), str), call


async def test_not_ready_is_503(triton):
    t = await triton(ready=False)
    assert await t("is_server_live")
    assert not await t("is_server_ready") and not await t("is_model_ready", "fake-model")
    resp = await t.client.get("/v2/health/ready")
    assert resp.status == 503 and set(await resp.json()) == {"error"}


async def refused(t: Triton, status: str, match: str, *args, **kwargs) -> None:
    with pytest.raises(InferenceServerException) as err:
        await t("infer", *args, **kwargs)
    assert err.value.status() == status and match in err.value.message(), err.value.message()


async def test_bad_requests_are_the_protocols_errors(triton):
    t = await triton()
    text = [texts_input("text", TEXTS)]
    await refused(t, "404", "does not exist", "nope", text)
    await refused(t, "404", "no version `2`", "fake-model", text, model_version="2")
    numbers = http.InferInput("text", [2], "FP32").set_data_from_numpy(np.float32([1, 2]))
    await refused(t, "400", "input 'text' is BYTES of shape [N] or [N, 1], got FP32 [2]", "fake-model", [numbers])
    await refused(t, "400", "unknown input 'query'", "fake-model", [texts_input("query", ["q"])])
    scores = [http.InferRequestedOutput("scores")]
    await refused(t, "400", "unknown output 'scores'", "fake-model", text, outputs=scores)
    await refused(t, "400", "unknown parameter 'pooling'", "fake-model", text, parameters={"pooling": "mean"})
    await refused(t, "400", "parameter 'normalize'", "fake-model", text, parameters={"normalize": "yes"})
    await refused(t, "400", "X-Request-Timeout", "fake-model", text, timeout=1000)
    await refused(t, "400", "stateless", "fake-model", text, sequence_id=3)
    await refused(t, "400", "classification extension", "fake-model", text,
                  outputs=[http.InferRequestedOutput("embeddings", class_count=2)])
    wrong = http.InferInput("text", [2], "BYTES").set_data_from_numpy(np.array([b"a", b"b"], dtype=object))
    wrong.set_shape([3])  # the shape no longer fits the data
    await refused(t, "400", "tensor 'text': shape [3] holds 3 BYTES elements but the data has 2", "fake-model", [wrong])


async def test_raw_bodies_that_do_not_fit(triton):
    client = (await triton()).client
    ok = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}
    for body, headers, match in (
        ({"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": ["a", "b"]}]}, {}, "holds 3 elements"),
        ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES"}]}, {}, "has no data"),
        ({**ok, "extra": 1}, {}, "extra"),
        (ok, {"Inference-Header-Content-Length": "x"}, "Inference-Header-Content-Length"),
        ({"inputs": [{"name": "text", "shape": [1], "datatype": "BF16", "data": [1]}]}, {}, "BF16"),
    ):
        resp = await client.post("/v2/models/fake-model/infer", json=body, headers=headers)
        answer = await resp.json()
        assert resp.status == 400 and set(answer) == {"error"} and match in answer["error"], answer
    resp = await client.post("/v2/models/fake-model/infer", data=b'{"inputs": []}' + b"\x00\x01",
                             headers={"Inference-Header-Content-Length": "14"})
    assert resp.status == 400  # at least one input; and 2 bytes belong to none
    plain = await client.post("/v2/models/fake-model/infer", json={**ok, "id": ""})
    assert plain.status == 200 and (await plain.json())["id"] == ""
    assert plain.headers["Content-Type"].startswith("application/json")


async def test_the_api_key_and_the_request_limits(triton):
    config = GatewayConfig(api_key="sekrit", max_request_bytes=4096)
    t = await triton(config=config)
    await refused(t, "401", "Unauthorized", "fake-model", [texts_input("text", TEXTS)])
    assert await t("is_server_live") and await t("is_server_ready")  # the probes are public
    keyed = Triton(t.client, {"Authorization": "Bearer sekrit"})
    try:
        await keyed_calls(t, keyed)
    finally:
        keyed.close()


async def keyed_calls(t: Triton, keyed: Triton) -> None:
    assert (await keyed("get_model_metadata", "fake-model"))["name"] == "fake-model"
    with pytest.raises(InferenceServerException) as err:
        await t("get_model_metadata", "fake-model")
    assert err.value.status() == "401"
    await refused(keyed, "413", "--max-request-bytes", "fake-model", [texts_input("text", ["x" * 5000])])
    ok = await keyed("infer", "fake-model", [texts_input("text", TEXTS[:2])], request_compression_algorithm="gzip")
    assert ok.as_numpy("embeddings").shape == (2, 8)


async def test_a_model_name_with_slashes(triton):
    t = await triton(models=[fake_model(name="org/embedder")])  # tritonclient leaves the slash unescaped
    result = await t("infer", "org/embedder", [texts_input("text", TEXTS)], model_version="1")
    assert result.get_response()["model_name"] == "org/embedder" and result.as_numpy("embeddings").shape == (3, 8)
    assert await t("is_model_ready", "org/embedder") and await t("is_model_ready", "org/embedder", "1")
    assert (await t("get_model_metadata", "org/embedder", "1"))["name"] == "org/embedder"
    assert (await t("get_model_config", "org/embedder"))["name"] == "org/embedder"
    with pytest.raises(InferenceServerException) as err:
        await t("get_inference_statistics", "org/embedder")
    assert err.value.status() == "404" and "statistics are not implemented" in err.value.message()


async def test_the_rerank_document_cap(triton):
    t = await triton(models=[cross_encoder()], config=GatewayConfig(max_documents_per_rerank=2))
    inputs = [texts_input("query", ["q"]), texts_input("documents", ["a", "b", "c"])]
    await refused(t, "400", "--max-documents-per-rerank", "fake-model", inputs)


class Scope(dict):
    """What gRPC passes ``infer`` instead of an aiohttp request: the app, the headers, ``get()`` and ``[]``."""

    def __init__(self, app, headers: dict | None = None):
        super().__init__({REQUEST_ID: "grpc-1"})
        self.app, self.headers = app, headers or {}


async def test_infer_takes_any_scope_with_the_requests_interface(triton):
    t = await triton()
    text = from_data("text", "BYTES", [3], TEXTS)
    [got] = await infer(Scope(t.client.app), "fake-model", "", [text], None, {"normalize": True})
    assert got.name == "embeddings" and np.array_equal(got.data, await openai_vectors(t.client, TEXTS))
    with pytest.raises(InvalidRequest, match="X-Request-Timeout"):
        await infer(Scope(t.client.app, {"X-Request-Timeout": "soon"}), "fake-model", "1", [text], None, {})
