"""ColPali, ColQwen2 and ColModernVBERT over HTTP: a text query against page images on /score and /rerank (MaxSim), a page's token
vectors on /pooling, against transformers' processor, forward and ``score_retrieval`` (tiny random checkpoints
served by ``poolgate serve``)."""
from __future__ import annotations

import numpy as np
import pytest
import requests

from tests.live_server import served_url
from tests.workers.models.late_visual import data_url, sample_image
from tests.workers.models.test_late_visual import FOLDERS, QUERIES, SIZES, reference, retrieval_class, worst_cosine


@pytest.fixture(scope="module", params=list(FOLDERS))
def served(request, tmp_path_factory):
    name = request.param
    folder = FOLDERS[name](tmp_path_factory.mktemp(name))
    from transformers import AutoProcessor

    cls = retrieval_class(name)
    images = [sample_image(h, w, seed=i) for i, (h, w) in enumerate(SIZES[name])]
    state = (name, AutoProcessor.from_pretrained(folder), cls.from_pretrained(folder).eval(), images)
    for url in served_url(folder, str(folder), "--served-model-name", name, "--dtype", "float32"):
        yield (url, *state)


def content(image) -> dict:
    return {"content": [{"type": "image_url", "image_url": {"url": data_url(image)}}]}


def test_score_and_rerank_are_maxsim(served):
    url, name, processor, model, images = served
    q = reference(model, processor.process_queries(text=QUERIES[:1]))
    expected = processor.score_retrieval(q, reference(model, processor.process_images(images=images))).numpy()[0]
    r = requests.post(f"{url}/score", json={"model": name, "queries": QUERIES[0],
                                            "documents": [content(x) for x in images]}, timeout=60)
    assert r.status_code == 200, r.text
    scores = np.array([d["score"] for d in sorted(r.json()["data"], key=lambda d: d["index"])])
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    r = requests.post(f"{url}/rerank", json={"model": name, "query": QUERIES[0],
                                             "documents": [content(x) for x in images]}, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == list(np.argsort(-expected))
    np.testing.assert_allclose([x["relevance_score"] for x in results], np.sort(expected)[::-1], rtol=1e-4,
                               atol=1e-4)


def test_page_token_vectors_on_pooling(served):
    url, name, processor, model, images = served
    r = requests.post(f"{url}/pooling", json={"model": name, "task": "token_embed", "messages": [
        {"role": "user", "content": content(images[1])["content"]}]}, timeout=60)
    assert r.status_code == 200, r.text
    ours = np.asarray(r.json()["data"][0]["data"], dtype=np.float32)
    theirs = reference(model, processor.process_images(images=[images[1]]))
    assert worst_cosine([ours], theirs) >= 0.9999


def test_text_with_an_image_in_one_document_is_a_400(served):
    url, name, _, _, images = served
    doc = {"content": [{"type": "text", "text": "chart"}, *content(images[0])["content"]]}
    r = requests.post(f"{url}/score", json={"model": name, "queries": "what", "documents": [doc]}, timeout=60)
    assert r.status_code == 400, r.text
    assert "a document holds 1 image and text" in r.json()["error"]["message"]
