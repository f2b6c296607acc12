"""*ForImageClassification through the engine (workers.models.media.image_classify) against transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.workers.offline import PoolingModel
from tests.workers.media import classifiers as tiny

CLASSIFY, LOGITS = PoolingParams(task="classify"), PoolingParams(task="classify", use_activation=False)


@pytest.mark.parametrize("make", [tiny.vit, tiny.deit, tiny.convnext, tiny.clip])
def test_probabilities_and_logits_equal_transformers(make, tmp_path):
    model = make(tmp_path)
    inputs, pixels = tiny.image_inputs()
    want = tiny.image_reference(model, tmp_path, pixels)
    worst = {}
    for dtype in ("float32", "bfloat16"):
        with PoolingModel(str(tmp_path), dtype=dtype) as served:
            assert served.info.modalities == ("image",) and served.info.tasks == ("classify",)
            assert served.labels == tuple(model.config.id2label[i] for i in range(model.config.num_labels))
            probs = served.submit(inputs, CLASSIFY)
            logits = served.submit(inputs, LOGITS).outputs.values
        cos = tiny.cosines(probs.outputs.values, torch.from_numpy(want).softmax(-1).numpy())
        worst[dtype] = float(cos.min())
        worst[dtype + " logits"] = float(tiny.cosines(logits, want).min())
        if dtype == "float32":
            np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
            assert worst[dtype] >= 0.9999
            assert len(set(probs.prompt_tokens)) == 1 and probs.prompt_tokens[0] > 0
        else:
            assert worst[dtype] >= 0.99
    print(f"{type(model).__name__}: worst cosine probabilities fp32 {worst['float32']:.9f} bf16 "
          f"{worst['bfloat16']:.9f}; logits fp32 {worst['float32 logits']:.9f} bf16 {worst['bfloat16 logits']:.9f}")


def test_multi_label_is_sigmoid_and_tokens_are_patches_plus_one(tmp_path):
    model = tiny.vit(tmp_path, problem_type="multi_label_classification")
    inputs, pixels = tiny.image_inputs()
    want = torch.from_numpy(tiny.image_reference(model, tmp_path, pixels[:3])).sigmoid().numpy()
    with PoolingModel(str(tmp_path), dtype="float32") as served:
        result = served.submit(inputs[:3], CLASSIFY)
    np.testing.assert_allclose(result.outputs.values, want, rtol=1e-5, atol=1e-6)
    assert result.prompt_tokens == [(32 // 8) ** 2 + 1] * 3


def test_text_and_audio_and_two_images_are_400s(tmp_path):
    tiny.vit(tmp_path)
    inputs, _ = tiny.image_inputs()
    image = inputs[0].parts[0]
    bad = {
        "this model reads images, not text": ["a photo of a cat"],
        "this model reads images only; send the input without its text": [MediaInput(("a cat", image))],
        "this model reads images, not audio clips": [MediaInput((MediaRef("audio", data=b"RIFF"),))],
        "this model reads one image per input, got 2 media parts": [MediaInput((image, image))],
        "the PNG image is corrupt": [MediaInput((MediaRef("image", data=b"\x89PNG\r\n\x1a\n" + bytes(9)),))],
    }
    with PoolingModel(str(tmp_path), dtype="float32") as served:
        for says, call in bad.items():
            with pytest.raises(InvalidRequest) as err:
                served.submit([inputs[1], *call], CLASSIFY)
            assert "input[1]: " + says in str(err.value), str(err.value)
