"""The image classifiers' processors (workers.models.media.image_classify.processor_settings) against
transformers' Pillow processors, and the ones refused at load."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from poolgate.shared.inputs.media.pixels import pixel_values
from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.models.media.image_classify import architectures, processor_settings
from tests.workers.media.classifiers import image_inputs

ACCEPTED = [
    ("ViTImageProcessorPil", {}),
    ("ViTImageProcessorPil", {"size": {"height": 40, "width": 56}, "resample": 3}),
    ("DeiTImageProcessorPil", {}),
    ("BeitImageProcessorPil", {"do_center_crop": True, "size": {"height": 256, "width": 256}}),
    ("BitImageProcessorPil", {}),
    ("CLIPImageProcessorPil", {}),
    ("SiglipImageProcessorPil", {}),
    ("ConvNextImageProcessorPil", {"size": {"shortest_edge": 224}}),  # crop_pct: resize to 256, crop 224
    ("ConvNextImageProcessorPil", {"size": {"shortest_edge": 64}, "crop_pct": 0.9}),
    ("ConvNextImageProcessorPil", {}),  # 384: resized to a square, no crop
]


@pytest.mark.parametrize(("name", "kwargs"), ACCEPTED, ids=[f"{n} {k}" for n, k in ACCEPTED])
def test_pixels_equal_transformers_pil_processor(name, kwargs, tmp_path):
    import transformers

    proc = getattr(transformers, name)(**kwargs)
    proc.save_pretrained(tmp_path)
    processor, settings = processor_settings(tmp_path)
    assert processor == name.removesuffix("Pil")
    _, images = image_inputs()
    for rgb in images:
        want = proc(Image.fromarray(rgb), return_tensors="np")["pixel_values"][0]
        got = pixel_values(rgb, settings)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


@pytest.mark.parametrize(("name", "says"), [
    ("EfficientNetImageProcessorPil", "image processor EfficientNetImageProcessor is not supported"),
    ("LevitImageProcessorPil", "image processor LevitImageProcessor is not supported"),
    ("MobileViTImageProcessorPil", "image processor MobileViTImageProcessor is not supported"),
])
def test_other_processors_are_refused_by_name(name, says, tmp_path):
    import transformers

    getattr(transformers, name)().save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=says):
        processor_settings(tmp_path)


def test_no_processor_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no preprocessor_config.json"):
        processor_settings(tmp_path)


def test_every_image_classification_class_is_registered():
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES as names

    from poolgate.workers.models.media.families import MEDIA_ARCHITECTURES

    assert {"ViTForImageClassification", "DeiTForImageClassificationWithTeacher", "ConvNextForImageClassification",
            "CLIPForImageClassification", "SiglipForImageClassification"} <= set(architectures())
    assert len(architectures()) >= len(names)
    assert all(MEDIA_ARCHITECTURES[a].name == "image_classify" for a in architectures())
