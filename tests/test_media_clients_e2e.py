"""Real clients, unmodified but for the base URL, sending images to a live `poolgate serve` of a tiny random CLIP
(float32, with an API key): the openai SDK (vLLM's chat-style body, both ways vLLM's users send it), the cohere
SDK's v2 embed with `images` and with v4 `inputs`, LlamaIndex's CohereEmbedding (a MultiModalEmbedding that
speaks Cohere's API to any base URL), and /score and /rerank with image documents. Every vector equals
transformers' own (CLIPModel's text and image features from its tokenizer and CLIPImageProcessorPil) at cosine
>= 0.9999; the worst is printed with -s."""
from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import requests
from PIL import Image

from tests.live_server import live_server
from tests.workers.media.dual_encoders import make_dual, png, reference

KEY = "sk-media"
NAME = "embed-v4.0"  # LlamaIndex's CohereEmbedding takes only Cohere's model names
MIN_COSINE = 0.9999
TEXTS = ["w1 w2 w3", "w7", "w90 w4 w4 w4"]
IMAGES = [png(1), png(2, 64, 20), png(3, 30, 90, "JPEG"), png(4, 32, 32, "WEBP")]
AUTH = {"Authorization": f"Bearer {KEY}"}


def data_url(data: bytes) -> str:
    fmt = Image.open(io.BytesIO(data)).format.lower()
    return f"data:image/{fmt};base64,{base64.b64encode(data).decode()}"


def image_part(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data)}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The live server's URL and transformers' unit text and image vectors of TEXTS and IMAGES."""
    tmp = tmp_path_factory.mktemp("clip")
    folder = tmp / "clip"
    model = make_dual(folder, "clip")
    want_text, want_image = reference(folder, model, "clip", TEXTS, IMAGES)
    with live_server(tmp, str(folder), "--served-model-name", NAME, "--dtype", "float32", "--api-key", KEY) as server:
        yield server.url, want_text, want_image
        assert "Traceback" not in server.log_text(), server.log_text()[-3000:]


def worst_cosine(name: str, got, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float32).reshape(want.shape)
    cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1)
    print(f"{name}: worst cosine vs transformers {cos.min():.7f}")
    assert cos.min() >= MIN_COSINE, (name, cos)
    return float(cos.min())


def test_openai_sdk_chat_embeddings_with_images(served):
    import openai
    from openai.types import CreateEmbeddingResponse

    url, want_text, want_image = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY)
    # vLLM's documented way: the SDK's post with the chat-style body, one conversation per call
    got = [client.post("/embeddings", cast_to=CreateEmbeddingResponse, body={
        "model": NAME, "messages": [{"role": "user", "content": [image_part(b)]}], "encoding_format": "float",
    }).data[0].embedding for b in IMAGES]
    worst_cosine("openai SDK post /embeddings messages (images)", got, want_image)
    # embeddings.create with `input` left out and the messages in extra_body: a batch of conversations
    conversations = [[{"role": "user", "content": [image_part(b)]}] for b in IMAGES]
    conversations += [[{"role": "user", "content": [{"type": "text", "text": t}]}] for t in TEXTS]
    out = client.embeddings.create(model=NAME, input=openai.omit, extra_body={"messages": conversations})
    vectors = [d.embedding for d in out.data]  # (the SDK asked base64 and decoded it)
    worst_cosine("openai SDK embeddings.create extra_body messages (images)", vectors[:4], want_image)
    worst_cosine("openai SDK embeddings.create extra_body messages (texts)", vectors[4:], want_text)
    jina = client.embeddings.create(model=NAME, input=[{"text": TEXTS[0]}, {"image": data_url(IMAGES[1])},
                                                      {"image": base64.b64encode(IMAGES[2]).decode()}])  # Jina's
    worst_cosine("openai SDK embeddings.create Jina objects", [d.embedding for d in jina.data],
                 np.stack([want_text[0], want_image[1], want_image[2]]))
    texts = client.embeddings.create(model=NAME, input=TEXTS)  # plain texts go to the text tower
    worst_cosine("openai SDK embeddings.create input (texts)", [d.embedding for d in texts.data], want_text)
    assert out.usage.prompt_tokens > 0
    with pytest.raises(openai.BadRequestError, match="accepts text-only or image-only inputs"):
        client.embeddings.create(model=NAME, input=openai.omit, extra_body={
            "messages": [{"role": "user", "content": [{"type": "text", "text": "w1"}, image_part(IMAGES[0])]}]})


def test_cohere_sdk_images_and_v4_inputs(served):
    import cohere

    url, want_text, want_image = served
    client = cohere.ClientV2(base_url=url, api_key=KEY)
    out = client.embed(model=NAME, input_type="image", embedding_types=["float"],
                       images=[data_url(b) for b in IMAGES])
    worst_cosine("cohere SDK ClientV2.embed(images=...)", out.embeddings.float_, want_image)
    assert [(i.width, i.height, i.format) for i in out.images] == [(45, 37, "png"), (64, 20, "png"),
                                                                   (30, 90, "jpeg"), (32, 32, "webp")]
    inputs = [{"content": [{"type": "text", "text": TEXTS[0]}]}, {"content": [image_part(IMAGES[0])]},
              {"content": [{"type": "text", "text": TEXTS[1]}]}, {"content": [image_part(IMAGES[1])]}]
    out = client.embed(model=NAME, input_type="search_document", embedding_types=["float", "int8"], inputs=inputs)
    vectors = np.float32(out.embeddings.float_)
    worst_cosine("cohere SDK ClientV2.embed(inputs=...) texts", vectors[0::2], want_text[:2])
    worst_cosine("cohere SDK ClientV2.embed(inputs=...) images", vectors[1::2], want_image[:2])
    assert len(out.embeddings.int8) == 4
    # text and an image in ONE input: one vector of both, which a dual encoder's towers cannot make (vLLM's 400)
    with pytest.raises(cohere.BadRequestError, match="accepts text-only or image-only inputs"):
        client.embed(model=NAME, input_type="search_document", embedding_types=["float"],
                     inputs=[{"content": [{"type": "text", "text": "w1"}, image_part(IMAGES[0])]}])


def test_llama_index_cohere_multimodal_embedding(served, tmp_path):
    unpacked = Path(__file__).resolve().parents[1] / ".cache" / "llama-index-cohere"  # .ci/run puts it there
    if unpacked.is_dir() and str(unpacked) not in sys.path:
        sys.path.append(str(unpacked))  # beside the install: its metadata's cohere<6 pin is not installed with it
    cohere_embedding = pytest.importorskip("llama_index.embeddings.cohere")
    from llama_index.core.embeddings import MultiModalEmbedding

    url, want_text, want_image = served
    embedder = cohere_embedding.CohereEmbedding(model_name=NAME, base_url=url, api_key=KEY)
    assert isinstance(embedder, MultiModalEmbedding)
    paths = []
    for i, data in enumerate(IMAGES):
        path = tmp_path / f"{i}.{Image.open(io.BytesIO(data)).format.lower()}"
        path.write_bytes(data)
        paths.append(str(path))
    worst_cosine("LlamaIndex CohereEmbedding.get_image_embedding_batch", embedder.get_image_embedding_batch(paths),
                 want_image)
    worst_cosine("LlamaIndex CohereEmbedding.get_text_embedding_batch", embedder.get_text_embedding_batch(TEXTS),
                 want_text)


def test_score_and_rerank_text_and_image_documents(served):
    url, want_text, want_image = served
    docs = [{"content": [image_part(IMAGES[0])]}, TEXTS[1], {"image": base64.b64encode(IMAGES[2]).decode()}]
    want = np.float32([want_text[0] @ want_image[0], want_text[0] @ want_text[1], want_text[0] @ want_image[2]])
    r = requests.post(f"{url}/score", headers=AUTH, timeout=60,
                      json={"model": NAME, "queries": TEXTS[0], "documents": docs})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], want, atol=1e-4)
    # image-image: an image query against image documents
    r = requests.post(f"{url}/score", headers=AUTH, timeout=60, json={
        "model": NAME, "queries": {"content": [image_part(IMAGES[1])]},
        "documents": [{"content": [image_part(b)]} for b in IMAGES]})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["score"] for d in r.json()["data"]], want_image @ want_image[1], atol=1e-4)
    r = requests.post(f"{url}/rerank", headers=AUTH, timeout=60,
                      json={"model": NAME, "query": TEXTS[0], "documents": docs})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == list(np.argsort(-want, kind="stable"))
    by_index = {x["index"]: x for x in results}
    assert by_index[1]["document"] == {"text": TEXTS[1], "multi_modal": None}
    assert by_index[0]["document"] == {"text": None, "multi_modal": [image_part(IMAGES[0])]}


@pytest.mark.parametrize("body, status, message", [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     400, "input[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/a.png"}}]}]},
     400, "not fetched by this server"),
    ({"messages": [{"role": "user", "content": [{"type": "image_embeds", "image_embeds": "AAAA"}]}]}, 400,
     "'image_embeds' parts (precomputed embeddings) are not served"),
])
def test_bad_images_are_4xx(served, body, status, message):
    url, _, _ = served
    r = requests.post(f"{url}/v1/embeddings", headers=AUTH, timeout=60, json={"model": NAME, **body})
    print(f"bad input -> {r.status_code} {r.json()['error']['message']}")
    assert r.status_code == status and message in r.json()["error"]["message"], r.text
