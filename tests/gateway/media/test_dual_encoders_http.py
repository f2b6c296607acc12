"""A tiny CLIP and SigLIP 2 over HTTP (the real gateway, dialects and worker): vectors and /score equal transformers."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.inputs.media.clip import dual_logit
from poolgate.shared.inputs.media.synthetic import data_url
from poolgate.workers.load.build import load_model
from tests.workers.media.dual_encoders import make_dual, png, reference

TEXTS = ["w1 w2 w3", "w7 w8"]
IMAGES = [png(11), png(12, 50, 30)]


def image_part(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data)}}


def vectors(body: dict) -> np.ndarray:
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]])


@pytest.mark.parametrize("kind", ["clip", "siglip2"])
async def test_embeddings_and_score_over_http(gateway, tmp_path, kind):
    ref = make_dual(tmp_path, kind)
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="m", dtype="float32"))
    client = await gateway(models=[model])
    want_text, want_image = reference(tmp_path, ref, kind, TEXTS, IMAGES)
    got = []
    for data in IMAGES:  # vLLM's chat form: one conversation, one image, one vector
        resp = await client.post("/v1/embeddings", json={
            "model": "m", "encoding_format": "base64",
            "messages": [{"role": "user", "content": [image_part(data)]}]})
        assert resp.status == 200, await resp.text()
        got.append(vectors(await resp.json())[0])
    assert (np.stack(got) * want_image).sum(-1).min() >= 0.9999
    resp = await client.post("/v1/embeddings", json={"model": "m", "input": TEXTS, "encoding_format": "base64"})
    assert resp.status == 200, await resp.text()
    assert (vectors(await resp.json()) * want_text).sum(-1).min() >= 0.9999
    # /score: a text query against an image document and a text one, cosine of the towers' vectors
    resp = await client.post("/score", json={"model": "m", "queries": TEXTS[0],
                                             "documents": [{"content": [image_part(IMAGES[1])]}, TEXTS[1]]})
    assert resp.status == 200, await resp.text()
    scores = [d["score"] for d in (await resp.json())["data"]]
    np.testing.assert_allclose(scores, [want_text[0] @ want_image[1], want_text[0] @ want_text[1]], atol=1e-5)
    settings = model.encoder.files.media  # what a route that reports logits applies to a score
    assert dual_logit(settings, scores[0]) == pytest.approx(np.exp(2.5) * scores[0] + (0 if kind == "clip" else -3))
    # use_activation asks for more than cosines: false the model's logits (transformers' logits_per_text),
    # true their trained activation (SigLIP's sigmoid per pair, CLIP's softmax over the query's documents)
    cosines = want_text[0] @ np.stack([want_image[0], want_image[1]]).T
    logits = np.exp(2.5) * cosines + (0 if kind == "clip" else -3)
    for asked, expect in ((False, logits), (True, np.exp(logits) / np.exp(logits).sum() if kind == "clip"
                                             else 1 / (1 + np.exp(-logits)))):
        resp = await client.post("/score", json={"model": "m", "queries": TEXTS[0], "use_activation": asked,
                                                 "documents": [{"content": [image_part(x)]} for x in IMAGES[:2]]})
        assert resp.status == 200, await resp.text()
        np.testing.assert_allclose([d["score"] for d in (await resp.json())["data"]], expect, rtol=1e-4, atol=1e-5)
    # a bad document is named as the request names it, not by the call's input index
    corrupt = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAAA"}}
    resp = await client.post("/rerank", json={"model": "m", "query": TEXTS[0],
                                              "documents": [TEXTS[1], {"content": [corrupt]}]})
    assert resp.status == 400 and (await resp.json())["error"]["message"].startswith("documents[1]: "), await resp.text()
    # text and an image in one input: the towers embed one or the other (vLLM's 400)
    resp = await client.post("/v1/embeddings", json={
        "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a cat"},
                                                                 image_part(IMAGES[0])]}]})
    assert resp.status == 400 and "text-only or image-only" in (await resp.json())["error"]["message"]
