"""Every dialect through its official client against a real `poolgate serve` on the bundled MiniLM (float32):
the openai and cohere SDKs, and the parity of every dialect and encoding with the OpenAI float vectors."""
from __future__ import annotations

import json
import urllib.request

import cohere
import numpy as np
import openai
import pytest
import torch
import tritonclient.http

from poolgate.gateway.dialects.quantize import EMBEDDING_TYPES
from poolgate.shared.config.models import DEFAULT_MODEL_NAME as MODEL
from tests.dialect_parity import EMBED_DTYPES, TEXTS, collect, table
from tests.live_server import served_url

FEW = TEXTS[:6]
TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
         "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    yield from served_url(tmp_path_factory.mktemp("serve"), "--dtype", "float32", "--max-batch-tokens", "2048")


@pytest.fixture(scope="module")
def floats(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    resp = client.embeddings.create(model=MODEL, input=FEW, encoding_format="float")
    return np.float32([d.embedding for d in resp.data])


def test_openai_sdk_default_base64_equals_float(url, floats):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    resp = client.embeddings.create(model=MODEL, input=FEW)  # the SDK asks base64 and decodes it
    assert np.array_equal(np.float32([d.embedding for d in resp.data]), floats)
    assert floats.shape == (6, 384) and np.allclose(np.linalg.norm(floats, axis=1), 1, atol=1e-5)
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > 0


def test_cohere_sdk_every_type_is_the_documented_quantization_of_the_float_vector(url, floats):
    co = cohere.ClientV2(api_key="x", base_url=url)
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    resp = co.embed(model=MODEL, texts=FEW, input_type=None, embedding_types=types)
    e = resp.embeddings
    assert np.array_equal(np.float32(e.float_), floats)
    for kind in ("int8", "uint8", "binary", "ubinary"):
        assert np.array_equal(np.asarray(getattr(e, kind)), np.stack([EMBEDDING_TYPES[kind](v) for v in floats])), kind
    import base64
    assert np.array_equal(np.stack([np.frombuffer(base64.b64decode(b), "<f4") for b in e.base64]), floats)
    assert resp.id.startswith("embd-") and resp.texts == FEW and resp.meta.api_version.version == "2"
    assert resp.meta.billed_units.input_tokens > 0


def test_cohere_v1_sdk_floats(url, floats):
    co = cohere.Client(api_key="x", base_url=url)
    resp = co.embed(model=MODEL, texts=FEW, batching=False)
    assert resp.response_type == "embeddings_floats"
    assert np.array_equal(np.float32(resp.embeddings), floats)


def test_cohere_sdk_search_query_on_a_model_without_prompts_is_the_plain_vector(url, floats):
    co = cohere.ClientV2(api_key="x", base_url=url)
    resp = co.embed(model=MODEL, texts=FEW, input_type="search_query", embedding_types=["float"])
    assert np.array_equal(np.float32(resp.embeddings.float_), floats)


def test_cohere_v1_sdk_reranks_a_long_document_in_chunks(url):
    co = cohere.Client(api_key="x", base_url=url)
    answer = "Photosynthesis turns sunlight, water and carbon dioxide into sugar."
    long = "The weather was mild and the market was busy that morning. " * 60 + answer  # ~780 tokens
    query = "How do plants make food?"
    with pytest.raises(cohere.BadRequestError):  # over the model's 256 tokens: vLLM's 400 without chunks
        co.rerank(model=MODEL, query=query, documents=[long])
    chunked = co.rerank(model=MODEL, query=query, documents=[long], max_chunks_per_doc=10).results[0]
    head = co.rerank(model=MODEL, query=query, documents=[long[:1000]]).results[0]  # what truncation would read
    assert chunked.index == 0 and chunked.relevance_score > head.relevance_score + 0.1  # the answer's window counts


def test_cohere_sdk_errors_carry_the_message(url):
    co = cohere.ClientV2(api_key="x", base_url=url)
    with pytest.raises(cohere.BadRequestError) as info:
        co.embed(model=MODEL, texts=["a"], input_type="bogus", embedding_types=["float"])
    assert info.value.body == {"message": "Unsupported input_type 'bogus'. Supported values: search_query, "
                                          "search_document, classification, clustering."}
    with pytest.raises(cohere.NotFoundError):
        co.embed(model="nope", texts=["a"], input_type=None, embedding_types=["float"])


def test_every_dialect_and_encoding_is_the_same_vector(url, floats):
    vectors = collect(url, FEW)
    for name in ("openai base64 float32", "openai bytes float32", "cohere float", "cohere base64",
                 "vllm /pooling float", "oip json", "oip binary"):
        assert np.array_equal(vectors[name], floats), name
    for dtype in EMBED_DTYPES:
        cast = torch.from_numpy(floats).to(TORCH[dtype]).float().numpy()
        assert np.array_equal(vectors[f"openai base64 {dtype}"], cast), dtype
        assert np.array_equal(vectors[f"openai bytes {dtype}"], cast), dtype
    worst = {name: cos for name, cos, _ in table(vectors)}
    assert worst["openai base64 float16"] > 0.99999 and worst["openai base64 fp8_e5m2"] > 0.99
    assert worst["cohere int8"] > 0.995 and worst["cohere uint8"] > 0.995 and worst["cohere binary"] > 0.6


def test_tritonclient_http_unmodified_gets_the_openai_vectors(url, floats):
    client = tritonclient.http.InferenceServerClient(url.removeprefix("http://"))  # MODEL's "/" goes unescaped
    try:
        text = tritonclient.http.InferInput("text", [len(FEW)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in FEW], dtype=object))  # binary, as by default
        got = client.infer(MODEL, [text]).as_numpy("embeddings")  # binary too: it names no outputs
        assert got.shape == floats.shape and np.allclose(got, floats, atol=1e-6)
        assert client.is_server_ready() and client.is_model_ready(MODEL)
        assert client.get_model_metadata(MODEL)["outputs"] == [{"name": "embeddings", "datatype": "FP32",
                                                                 "shape": [-1, 384]}]
    finally:
        client.close()


def test_openapi_document_lists_the_served_routes(url):
    with urllib.request.urlopen(f"{url}/openapi.json", timeout=10) as resp:
        doc = json.load(resp)
    assert {"/v1/embeddings", "/v2/embed", "/v1/embed", "/pooling"} <= set(doc["paths"])
    assert "/classify" not in doc["paths"]  # MiniLM does not classify
    ref = doc["paths"]["/v2/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    props = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
    assert {"texts", "inputs", "embedding_types", "truncate", "max_tokens", "output_dimension"} <= set(props)
