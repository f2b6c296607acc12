"""SigLIP 2's NaFlex image processor: resized to at most ``max_num_patches`` patches, kept near its aspect ratio.

``naflex_size`` finds the largest scale (a bisection to 1e-5, as
``Siglip2ImageProcessorPil`` does) at which the image, each side rounded up
to whole patches (at least one), holds at most ``max_num_patches`` patches;
``naflex_arrays`` resizes to it with Pillow, rescales and normalizes
(``pixels.pixel_values``), cuts the image into ``patch_size`` squares (each
flattened row-major over the patch, channels last) and pads them to
``max_num_patches`` rows: ``pixel_values`` ``(max_num_patches, 3 * p * p)``
float32, ``pixel_attention_mask`` ``(max_num_patches,)`` int32 (1 for a real
patch) and ``spatial_shapes`` ``(2,)`` int64 (patch rows, patch columns),
what ``Siglip2Model.get_image_features`` reads.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from poolgate.shared.inputs.media.pixels import PixelSettings, pixel_values


def naflex_size(height: int, width: int, patch_size: int, max_num_patches: int, eps: float = 1e-5) -> tuple[int, int]:
    """The (height, width) NaFlex resizes an image of that size to (module doc)."""

    def side(scale: float, size: int) -> int:
        return max(patch_size, math.ceil(size * scale / patch_size) * patch_size)

    low, high = eps / 10, 100.0
    while high - low >= eps:
        scale = (low + high) / 2
        if (side(scale, height) / patch_size) * (side(scale, width) / patch_size) <= max_num_patches:
            low = scale
        else:
            high = scale
    return side(low, height), side(low, width)


def naflex_arrays(
    pixels: np.ndarray, settings: PixelSettings, patch_size: int, max_num_patches: int
) -> dict[str, np.ndarray]:
    """RGB ``(h, w, 3)`` uint8 → the model's NaFlex arrays (module doc)."""
    height, width = naflex_size(pixels.shape[0], pixels.shape[1], patch_size, max_num_patches)
    sized = replace(settings, shortest_edge=None, height=height, width=width, crop_height=None, crop_width=None)
    image = pixel_values(pixels, sized)  # (3, height, width)
    rows, cols = height // patch_size, width // patch_size
    patches = image.reshape(3, rows, patch_size, cols, patch_size).transpose(1, 3, 2, 4, 0)
    patches = patches.reshape(rows * cols, patch_size * patch_size * 3)
    values = np.zeros((max_num_patches, patches.shape[1]), np.float32)
    values[: len(patches)] = patches
    mask = np.zeros(max_num_patches, np.int32)
    mask[: len(patches)] = 1
    return {"pixel_values": values, "pixel_attention_mask": mask, "spatial_shapes": np.array([rows, cols], np.int64)}
