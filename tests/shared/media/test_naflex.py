"""SigLIP 2's NaFlex processing (shared.inputs.media.naflex) equals transformers' Siglip2ImageProcessorPil."""
import numpy as np
import pytest
from PIL import Image
from transformers import Siglip2ImageProcessorPil

from poolgate.shared.inputs.media.naflex import naflex_arrays, naflex_size
from poolgate.shared.inputs.media.pixels import PixelSettings

SIZES = [(224, 224), (37, 45), (20, 640), (900, 120), (7, 7), (513, 301)]


@pytest.mark.parametrize("patch,most", [(16, 256), (8, 20), (14, 729)])
def test_naflex_equals_transformers(patch, most):
    processor = Siglip2ImageProcessorPil(patch_size=patch, max_num_patches=most)
    settings = PixelSettings.from_config(processor.to_dict())
    rng = np.random.default_rng(patch)
    for height, width in SIZES:
        rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        want = processor([Image.fromarray(rgb)], return_tensors="np")
        got = naflex_arrays(rgb, settings, patch, most)
        rows, cols = (int(x) for x in want["spatial_shapes"][0])
        assert tuple(got["spatial_shapes"]) == (rows, cols) and rows * cols <= most
        assert naflex_size(height, width, patch, most) == (rows * patch, cols * patch)
        np.testing.assert_array_equal(got["pixel_attention_mask"], want["pixel_attention_mask"][0])
        assert got["pixel_values"].shape == want["pixel_values"][0].shape and got["pixel_values"].dtype == np.float32
        np.testing.assert_allclose(got["pixel_values"], want["pixel_values"][0], atol=5e-7, rtol=0)
