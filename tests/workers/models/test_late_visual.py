"""ColPali, ColQwen2 (over Qwen2-VL and Qwen2.5-VL) and ColModernVBERT (visual late interaction) against transformers' own processor and forward.

Tiny random checkpoints (``tests.workers.models.late_visual``): the ids and
pixel arrays the gateway's plan makes equal the processor's, every token's
vector equals transformers' ``*ForRetrieval`` forward on the processor's output
(per token cosine >= 0.9999 in fp32; the worst is printed for fp32 and bf16),
and MaxSim through the score plan equals ``processor.score_retrieval``.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs.stage import InputStage
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.load.build import load_model
from poolgate.workers.offline import PoolingModel, offline_config
from tests.workers.models.late_visual import (colmodernvbert_folder, colpali_folder, colqwen2_folder, data_url,
                                              sample_image)

QUERIES = ["what is the revenue chart", "a", "which figure show the table of image"]
SIZES = {"colpali": [(28, 28), (60, 45), (33, 80)], "colqwen2": [(56, 84), (60, 90), (40, 40), (120, 50)],
         "colqwen2.5": [(56, 84), (112, 112), (40, 40), (120, 50)], "colmodernvbert": [(60, 45), (30, 90), (50, 50),
                                                                                      (200, 40)]}
FOLDERS = {"colpali": colpali_folder, "colqwen2": colqwen2_folder,
           "colqwen2.5": functools.partial(colqwen2_folder, backbone="qwen2_5_vl", max_pixels=28 * 28 * 64),
           "colmodernvbert": colmodernvbert_folder}


def retrieval_class(name: str):
    import transformers

    return {"colpali": transformers.ColPaliForRetrieval, "colqwen2": transformers.ColQwen2ForRetrieval,
            "colqwen2.5": transformers.ColQwen2ForRetrieval,
            "colmodernvbert": transformers.ColModernVBertForRetrieval}[name]


@pytest.fixture(scope="module", params=list(FOLDERS))
def family(request, tmp_path_factory):
    name = request.param
    folder = FOLDERS[name](tmp_path_factory.mktemp(name))
    from transformers import AutoProcessor

    cls = retrieval_class(name)
    images = [sample_image(h, w, seed=i) for i, (h, w) in enumerate(SIZES[name])]
    return name, folder, AutoProcessor.from_pretrained(folder), cls.from_pretrained(folder).eval(), images


def page(image) -> MediaInput:
    return MediaInput((MediaRef("image", url=data_url(image)),))


def reference(model, batch) -> list[torch.Tensor]:
    """transformers' token vectors of a processor batch, each sequence's real rows (the model zeroes the rest)."""
    with torch.no_grad():
        out = model(**batch).embeddings
    return [row[mask.bool()] for row, mask in zip(out, batch["attention_mask"], strict=True)]


def worst_cosine(ours: list[np.ndarray], theirs: list[torch.Tensor]) -> float:
    worst = 1.0
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == tuple(b.shape)
        a64, b64 = torch.from_numpy(np.asarray(a, np.float64)), b.double()
        worst = min(worst, float(torch.nn.functional.cosine_similarity(a64, b64, dim=-1).min()))
    return worst


def test_ids_and_pixels_equal_the_processor(family):
    name, folder, processor, _, images = family
    loaded = load_model(offline_config(str(folder), {"dtype": "float32"}))
    stage = InputStage(loaded.info, loaded.encoder)
    call = PoolingCall("t", "m", [*QUERIES, *map(page, images)], PoolingParams(task="token_embed"))
    encoded = stage.encode(call)
    for i, q in enumerate(QUERIES):
        assert encoded.ids[i] == processor.process_queries(text=[q])["input_ids"][0].tolist()
        assert encoded.media is not None and encoded.media[i] is None
    for j, image in enumerate(images):
        i = len(QUERIES) + j
        theirs = processor.process_images(images=[image])
        assert encoded.ids[i] == theirs["input_ids"][0].tolist()
        assert encoded.media is not None and encoded.media[i] is not None
        (item,) = encoded.media[i]
        assert item.tokens == sum(t == processor.image_token_id for t in encoded.ids[i])
        pixels = theirs["pixel_values"][0].numpy()  # one image's (no padding in a batch of one)
        np.testing.assert_allclose(item.arrays["pixel_values"], pixels, atol=2e-6, rtol=0)
        if name.startswith("colqwen2"):
            np.testing.assert_array_equal(item.arrays["image_grid_thw"], theirs["image_grid_thw"].numpy())
    if name != "colpali":  # the image's size decides its token count
        assert len({m.tokens for x in encoded.media[len(QUERIES):] for m in x}) > 1


@pytest.mark.parametrize("dtype, bound", [("float32", 0.9999), ("bfloat16", 0.99)])
def test_token_vectors_equal_transformers(family, dtype, bound):
    name, folder, processor, model, images = family
    theirs = reference(model, processor.process_queries(text=QUERIES)) + \
        reference(model, processor.process_images(images=images))  # padded batches, as users run them
    with PoolingModel(str(folder), dtype=dtype) as ours:
        assert ours.info.tasks == ("token_embed",) and ours.info.modalities == ("text", "image")
        rows = ours.encode([*QUERIES, *map(page, images)], pooling_task="token_embed")
    worst = worst_cosine(rows, theirs)
    print(f"{name} {dtype}: worst per-token cosine {worst:.7f} over {sum(len(r) for r in rows)} tokens")
    assert worst >= bound


def test_maxsim_equals_score_retrieval(family):
    name, folder, processor, model, images = family
    q = reference(model, processor.process_queries(text=QUERIES))
    p = reference(model, processor.process_images(images=images))
    expected = processor.score_retrieval(q, p).numpy()  # (queries, pages)
    with PoolingModel(str(folder), dtype="float32") as ours:
        one_to_n = ours.score(QUERIES[0], [page(x) for x in images])
        n = min(len(QUERIES), len(images))
        pairwise = ours.score(QUERIES[:n], [page(x) for x in images[:n]])
    np.testing.assert_allclose(one_to_n, expected[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pairwise, np.diagonal(expected)[:n], rtol=1e-4, atol=1e-4)
    assert len(set(np.round(one_to_n, 4))) > 1  # the pages score apart


def test_what_these_models_cannot_read_is_a_400(family):
    name, folder, _, _, images = family
    loaded = load_model(offline_config(str(folder), {"dtype": "float32"}))
    stage = InputStage(loaded.info, loaded.encoder, MediaLimits(max_images_per_request=2))
    url = data_url(images[0])
    bad = {
        "text and image": MediaInput(("what is it", MediaRef("image", url=url))),
        "two images": MediaInput((MediaRef("image", url=url), MediaRef("image", url=url))),
        "audio": MediaInput((MediaRef("audio", url="data:audio/wav;base64,AAAA"),)),
        "token ids": [5, 6, 7],
    }
    for what, x in bad.items():
        with pytest.raises(InvalidRequest) as caught:
            stage.encode(PoolingCall("t", "m", ["a query", x], PoolingParams(task="token_embed")))
        assert caught.value.param == "input[1]", what  # the 400 names the input
    with pytest.raises(InvalidRequest, match="max-images-per-request"):
        stage.encode(PoolingCall("t", "m", [page(images[0])] * 3, PoolingParams(task="token_embed")))
    with pytest.raises(InvalidRequest, match="cannot be truncated"):
        stage.encode(PoolingCall("t", "m", [page(images[0])], PoolingParams(task="token_embed",
                                                                             truncate_prompt_tokens=3)))
    if name.startswith("colqwen2"):  # Qwen2-VL's resize refuses sides more than 200 times apart
        with pytest.raises(InvalidRequest, match="200 times"):
            stage.encode(PoolingCall("t", "m", [page(sample_image(3, 700))], PoolingParams(task="token_embed")))
    text_only = stage.encode(PoolingCall("t", "m", [MediaInput(("a",))], PoolingParams(task="token_embed")))
    assert text_only.ids == stage.encode(PoolingCall("t", "m", ["a"], PoolingParams(task="token_embed"))).ids
