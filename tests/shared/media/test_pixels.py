"""The fixed-size processor (shared.inputs.media.pixels) against transformers' PIL processors, and its resize guard."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.inputs.media.pixels import PixelSettings, check_resize, pixel_values

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["CLIPImageProcessorPil", "SiglipImageProcessorPil", "ViTImageProcessorPil"])
@pytest.mark.parametrize("shape", [(300, 451), (224, 224), (37, 45), (500, 120)])
def test_equals_transformers(name, shape):
    from PIL import Image

    processor = getattr(transformers, name)()
    pixels = np.random.default_rng(sum(shape)).integers(0, 256, (*shape, 3), dtype=np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = processor(images=Image.fromarray(pixels), return_tensors="np")["pixel_values"][0]
    got = pixel_values(pixels, PixelSettings.from_config(processor.to_dict()))
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_resize_guard_counts_the_resized_image():
    clip = PixelSettings.from_config(transformers.CLIPImageProcessorPil().to_dict())  # short side to 224
    check_resize(clip, 20, 40, 224 * 448, "input[0]")  # 224 x 448 after the resize: at the limit
    with pytest.raises(InvalidRequest, match=r"resize it to 4480000 x 224 = 1,003,520,000 pixels"):
        check_resize(clip, 1, 20_000, 50_000_000, "input[0]")
    fixed = PixelSettings.from_config(transformers.SiglipImageProcessorPil().to_dict())  # always 224 x 224
    check_resize(fixed, 1, 20_000, 224 * 224, "input[0]")
