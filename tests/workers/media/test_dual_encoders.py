"""CLIP and SigLIP served end to end (the real plan, the real worker runner) equal transformers' own vectors."""
import io

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.score_plan import plan_scores
from poolgate.shared.inputs.media.clip import DualEncoderPlan, dual_logit
from poolgate.shared.inputs.media.synthetic import data_url
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.engine import Engine
from poolgate.workers.load.build import load_model
from tests.workers.media.dual_encoders import MAX_PATCHES, TEXT_LEN, make_dual, png, reference

TEXTS = ["w1 w2 w3", "w7", " ".join(f"w{i}" for i in range(40)), "w90 w4 w4 w4"]  # the third over the cap
IMAGES = [png(1), png(2, 64, 20), png(3, 30, 90, "JPEG"), png(4, 32, 32)]


def image(data: bytes) -> MediaInput:
    return MediaInput((MediaRef("image", data_url(data)),))


@pytest.fixture(scope="module", params=["clip", "siglip", "siglip2"])
def dual(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    ref = make_dual(folder, request.param)
    return request.param, folder, ref


async def embed(model, inputs, params: PoolingParams | None = None):
    engine = Engine(model)
    await engine.start()
    try:
        call = PoolingCall(request_id="r", model="t", inputs=inputs, params=params or PoolingParams())
        return await engine.submit(call)
    finally:
        await engine.stop()


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got = got / np.linalg.norm(got, axis=-1, keepdims=True)
    return (got * want).sum(-1)


@pytest.mark.parametrize("dtype,floor", [("float32", 0.9999), ("bfloat16", 0.99)])
async def test_vectors_equal_transformers(dual, dtype, floor):
    kind, folder, ref = dual
    model = load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype=dtype))
    assert model.info.modalities == ("text", "image") and model.info.tasks == ("embed",)
    want_text, want_image = reference(folder, ref, kind, TEXTS, IMAGES)
    mixed = [TEXTS[0], image(IMAGES[0]), TEXTS[1], image(IMAGES[1]), TEXTS[2], image(IMAGES[2]), TEXTS[3],
             image(IMAGES[3])]
    result = await embed(model, mixed)
    got = result.outputs.values
    text_cos, image_cos = cosines(got[0::2], want_text), cosines(got[1::2], want_image)
    print(f"{kind} {dtype}: worst cosine text {text_cos.min():.6f} image {image_cos.min():.6f}")
    assert text_cos.min() >= floor and image_cos.min() >= floor
    assert np.allclose(np.linalg.norm(got, axis=-1), 1, atol=1e-3)  # normalized, as vLLM's embed
    # patches (+ CLIP's class token; SigLIP 2's padded patch rows): an image's cost in the budget
    image_tokens = MAX_PATCHES if kind == "siglip2" else (32 // 8) ** 2 + (kind == "clip")
    assert result.prompt_tokens[1::2] == [image_tokens] * 4
    assert result.prompt_tokens[4] == TEXT_LEN[kind]  # the long text cut to the tower's positions
    if kind != "clip":  # every SigLIP text padded to its length, as it was trained
        assert result.prompt_tokens[0::2] == [TEXT_LEN[kind]] * 4
    if dtype == "float32":  # the mixed batch gives each input the vector it gets alone
        texts = (await embed(model, TEXTS)).outputs.values
        images = (await embed(model, [image(b) for b in IMAGES])).outputs.values
        alone = np.empty_like(got)
        alone[0::2], alone[1::2] = texts, images
        np.testing.assert_allclose(got, alone, atol=2e-6)


async def test_logit_scale_rides_in_the_plan_settings(dual):
    kind, folder, ref = dual
    model = load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32"))
    settings = model.encoder.files.media
    assert settings["plan"] == "clip" and settings["logit_scale"] == pytest.approx(2.5)
    assert settings["logit_bias"] == (None if kind == "clip" else pytest.approx(-3.0))
    result = await embed(model, [TEXTS[0], image(IMAGES[0])])
    cos = float(result.outputs.values[0] @ result.outputs.values[1])
    tok = AutoTokenizer.from_pretrained(str(folder))
    pad = {"padding": "max_length", "max_length": TEXT_LEN[kind]} if kind != "clip" else {}
    ids = tok([TEXTS[0]], return_tensors="pt", **pad)["input_ids"]
    pixels = AutoImageProcessor.from_pretrained(str(folder))([Image.open(io.BytesIO(IMAGES[0])).convert("RGB")],
                                                             return_tensors="pt")
    with torch.no_grad():
        want = float(ref(input_ids=ids, **pixels).logits_per_text[0, 0])
    assert dual_logit(settings, cos) == pytest.approx(want, rel=1e-4, abs=1e-4)


async def test_text_and_image_in_one_input_is_a_400(dual):
    kind, folder, _ = dual
    model = load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32"))
    both = MediaInput(("a caption", MediaRef("image", data_url(IMAGES[0]))))
    with pytest.raises(InvalidRequest, match="accepts text-only or image-only inputs"):
        await embed(model, ["w1", both])
    two = MediaInput((MediaRef("image", data_url(IMAGES[0])), MediaRef("image", data_url(IMAGES[1]))))
    with pytest.raises(InvalidRequest, match="2 images"):
        await embed(model, [two])
    ids = model.encoder.encode([TEXTS[0]])[0]  # token ids sent as such: the text's vector (SigLIP's padded too)
    as_ids, as_text = (await embed(model, [ids])).outputs.values, (await embed(model, [TEXTS[0]])).outputs.values
    np.testing.assert_allclose(as_ids, as_text, atol=1e-6)
    with pytest.raises(InvalidRequest, match="(?i)token id 100 is out of vocabulary"):  # never a 500 in a batch
        await embed(model, [[2, 5, 100, 3]])
    with pytest.raises(InvalidRequest, match="over the text tower's"):
        await embed(model, [[5] * (TEXT_LEN[kind] + 1)])
    if kind == "clip":  # the short side resized to 32 keeps the aspect ratio: 1 x 5,000 would be 160,000 x 32
        plan = DualEncoderPlan(model.info, model.encoder, model.encoder.files.media)
        call = PoolingCall(request_id="r", model="t", inputs=[image(png(5, 5000, 1))])
        with pytest.raises(InvalidRequest, match="would resize it to 160000 x 32 = 5,120,000 pixels"):
            plan.encode(call, MediaLimits(max_image_pixels=1_000_000))
    with pytest.raises(InvalidRequest, match="not valid base64|corrupt"):
        await embed(model, [MediaInput((MediaRef("image", "data:image/png;base64,AAAA"),))])
    chat = ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},)
    asked = MediaInput((MediaRef("image", data_url(IMAGES[0])),), chat=chat, add_generation_prompt=True)
    with pytest.raises(InvalidRequest, match="without a chat template, so add_generation_prompt cannot apply"):
        await embed(model, [asked])  # a dual encoder reads no template: refused, never ignored


async def test_bi_encoder_score_of_a_text_query_and_image_documents(dual):
    """The /score path for embedding models (shared.domain.score_plan): one call of the query and the documents,
    images among them; the scores are transformers' cosines, and ``dual_logit`` of them its logits."""
    kind, folder, ref = dual
    model = load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32"))
    plan = plan_scores(model.info, [TEXTS[0]], [image(IMAGES[0]), TEXTS[1], image(IMAGES[2])])
    result = await embed(model, plan.inputs, plan.params())
    scores = plan.scores(result.outputs).values
    want_text, want_image = reference(folder, ref, kind, TEXTS[:2], [IMAGES[0], IMAGES[2]])
    want = [want_text[0] @ want_image[0], want_text[0] @ want_text[1], want_text[0] @ want_image[1]]
    np.testing.assert_allclose(scores, want, atol=1e-5)


async def test_bench_shape_folder_serves(tmp_path, capsys):
    """``poolgate bench-arch --family clip --write-to DIR`` writes a folder ``poolgate serve`` loads."""
    import argparse

    from poolgate.gateway.bench.arch import add_arguments, main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args(["--family", "clip", "--shape", "tiny", "--write-to", str(tmp_path)])) == 0
    assert main(parser.parse_args(["--family", "clip", "--shape", "nope", "--write-to", str(tmp_path)])) == 2
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32"))
    result = await embed(model, ["a photo of a cat", image(IMAGES[0])])
    assert result.prompt_tokens[1] == (32 // 8) ** 2 + 1 and result.outputs.values.shape == (2, 16)
