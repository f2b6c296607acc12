"""The clients people already use, unmodified but for the base URL, against a real `poolgate serve` on the bundled
MiniLM (float32, with an API key): huggingface_hub's InferenceClient and LlamaIndex's TextEmbeddingsInference on
TEI's routes, LangChain's and LlamaIndex's OpenAI embeddings on /v1/embeddings; each gets the /v1/embeddings
vectors (worst cosine printed with -s)."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from poolgate.shared.config.models import DEFAULT_MODEL_NAME as MODEL
from tests.dialect_parity import TEXTS
from tests.live_server import served_url

KEY = "sk-clients"
FEW = TEXTS[:8]
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    yield from served_url(tmp_path_factory.mktemp("serve"), "--dtype", "float32", "--max-batch-tokens", "2048",
                          "--api-key", KEY)


@pytest.fixture(scope="module")
def reference(url) -> np.ndarray:
    """/v1/embeddings float vectors of FEW, (n, 384)."""
    req = urllib.request.Request(f"{url}/v1/embeddings", data=json.dumps({"input": FEW}).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return np.float32([d["embedding"] for d in json.loads(resp.read())["data"]])


def worst_cosine(name: str, got, reference: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float32).reshape(reference.shape)
    cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
    print(f"{name}: worst cosine vs /v1/embeddings {cos.min():.7f}, max |diff| {np.abs(got - reference).max():.2e}")
    assert cos.min() >= MIN_COSINE, name
    return float(cos.min())


def test_huggingface_hub_inference_client(url, reference):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=url, api_key=KEY)
    vectors = [client.feature_extraction(text) for text in FEW]  # POST / with {"inputs": text}
    worst_cosine("huggingface_hub InferenceClient.feature_extraction", vectors, reference)
    raw = client.feature_extraction(FEW[3], normalize=False, truncate=True, truncation_direction="left")
    assert abs(float(np.linalg.norm(raw)) - 1) > 1e-3  # normalize=False reached the server
    scores = client.sentence_similarity(FEW[0], other_sentences=FEW[1:4])
    want = reference[1:4] @ reference[0]
    assert np.allclose(scores, want, atol=1e-5)


def test_llama_index_text_embeddings_inference(url, reference):
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embedder = TextEmbeddingsInference(model_name=MODEL, base_url=url, auth_token=KEY, embed_batch_size=3)
    worst_cosine("LlamaIndex TextEmbeddingsInference", embedder.get_text_embedding_batch(FEW), reference)
    assert np.allclose(embedder.get_query_embedding(FEW[2]), reference[2], atol=1e-6)


def test_langchain_openai_embeddings(url, reference):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: LangChain would otherwise send tiktoken ids, meaningless to MiniLM
    embedder = OpenAIEmbeddings(model=MODEL, base_url=f"{url}/v1", api_key=KEY, check_embedding_ctx_length=False)
    worst_cosine("langchain-openai OpenAIEmbeddings", embedder.embed_documents(FEW), reference)
    assert np.allclose(embedder.embed_query(FEW[1]), reference[1], atol=1e-6)


def test_llama_index_openai_embedding(url, reference):
    from llama_index.embeddings.openai import OpenAIEmbedding

    embedder = OpenAIEmbedding(model_name=MODEL, api_base=f"{url}/v1", api_key=KEY, embed_batch_size=4)
    worst_cosine("LlamaIndex OpenAIEmbedding", embedder.get_text_embedding_batch(FEW), reference)


def test_a_tei_client_without_the_key_is_refused(url):
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import HfHubHTTPError

    with pytest.raises(HfHubHTTPError) as info:
        InferenceClient(base_url=url, api_key="wrong").feature_extraction("x")
    assert info.value.response.status_code == 401


def _post(url: str, path: str, body: dict):
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def test_tei_tokenize_and_decode_match_the_models_tokenizer(url):
    from transformers import AutoTokenizer

    from poolgate.shared.config.models import bundled_model_path

    text = "Hello, World! Tokenizers split héllo-wörld."
    reference = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    want = reference(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    (tokens,) = _post(url, "/tokenize", {"inputs": text})
    assert [t["id"] for t in tokens] == want["input_ids"]
    assert [t["special"] for t in tokens] == [bool(m) for m in want["special_tokens_mask"]]
    for token, (start, stop), special in zip(tokens, want["offset_mapping"], want["special_tokens_mask"]):
        if not special:
            assert (token["start"], token["stop"], token["text"]) == (start, stop, text[start:stop])
    assert _post(url, "/decode", {"ids": want["input_ids"]}) == [reference.decode(want["input_ids"],
                                                                                  skip_special_tokens=True)]
