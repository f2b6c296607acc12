"""The Qwen2-VL image processor port against transformers' ``Qwen2VLImageProcessorPil``: same patches, same grid."""

from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.inputs.media.qwen2_vl import QwenImageSettings, image_item, patches, smart_resize

SIZES = [(224, 224), (100, 300), (37, 491), (640, 480), (12, 12), (1000, 17), (333, 777), (29, 29)]
CONFIGS = [
    {},  # the processor's defaults
    {"min_pixels": 3136, "max_pixels": 100352},  # a small budget: large images shrink
    {"size": {"shortest_edge": 256 * 28 * 28, "longest_edge": 1024 * 28 * 28}},  # large images grow
    {
        "patch_size": 16,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "min_pixels": 4096,
        "max_pixels": 200704,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 2,
    },  # Qwen3-VL's numbers, bilinear
]


def _reference(config: dict):
    transformers = pytest.importorskip("transformers")
    return transformers.Qwen2VLImageProcessorPil(**config)


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "small", "large", "qwen3"])
def test_patches_equal_transformers(config):
    ref = _reference(config)
    settings = QwenImageSettings.from_config(config)
    rng = np.random.default_rng(7)
    for height, width in SIZES:
        rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        want = ref(images=[rgb], return_tensors="np")
        values, grid = patches(rgb, settings)
        assert grid.tolist() == want["image_grid_thw"].tolist(), (height, width)
        assert values.shape == want["pixel_values"].shape and values.dtype == np.float32
        assert np.abs(values - want["pixel_values"]).max() <= 1e-6, (height, width)
        tokens = ref.get_number_of_image_patches(height, width) // settings.merge_size**2
        assert settings.tokens(height, width) == tokens == image_item(rgb, settings).tokens


def test_settings_from_a_saved_config_and_back(tmp_path):
    ref = _reference({"min_pixels": 1000, "max_pixels": 50000})
    ref.save_pretrained(tmp_path)
    import json

    saved = json.loads((tmp_path / "preprocessor_config.json").read_text())
    settings = QwenImageSettings.from_config(saved)
    assert (settings.min_pixels, settings.max_pixels) == (1000, 50000)
    assert QwenImageSettings.from_dict(settings.to_dict()) == settings


def test_smart_resize_bounds_and_refusal():
    for height, width in [(1, 150), (5000, 7000), (28, 28), (99, 2)]:
        h, w = smart_resize(height, width, 28, 3136, 28 * 28 * 1280)
        assert h % 28 == 0 and w % 28 == 0 and 3136 <= h * w <= 28 * 28 * 1280
    with pytest.raises(ValueError, match="200"):
        smart_resize(10, 2001, 28, 3136, 1003520)


def test_item_digest_follows_pixels_and_settings():
    rgb = np.full((56, 84, 3), 9, np.uint8)
    a = image_item(rgb, QwenImageSettings())
    assert a.arrays["image_grid_thw"].tolist() == [[1, 4, 6]] and a.tokens == 6
    assert a.digest == image_item(rgb.copy(), QwenImageSettings()).digest
    assert a.digest != image_item(rgb, QwenImageSettings(max_pixels=28 * 28 * 4)).digest
    other = rgb.copy()
    other[0, 0, 0] = 10
    assert a.digest != image_item(other, QwenImageSettings()).digest
