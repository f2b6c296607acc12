"""The Idefics3 image processor (torch-free), as ModernVBERT / ColModernVBERT read images: tiles and a global view.

An image is first resized so its longest edge is ``size.longest_edge`` (up or
down; the other side keeps the aspect ratio, rounded up to an even number;
neither side over 4,096), then, with image splitting, its sides are rounded up
to multiples of the tile size (``max_image_size.longest_edge``) and it is cut
into ``rows`` x ``cols`` tiles, row by row, followed by the whole image resized
to one tile (the global view); an image no larger than one tile is that tile
alone (``rows = cols = 0``). Without splitting the image is resized to one
tile. Each resize is Pillow's on the uint8 pixels (LANCZOS by default), then
the frames are rescaled (in float64, stored float32) and normalized in float32,
channels first, as transformers' ``Idefics3ImageProcessorPil`` does. Every
frame is a tile, so no frame of one image is padded; a batch pads its images'
frame counts with all-zero frames, which the model skips.

The text that stands for an image (``placeholder``) is the processor's: per
tile ``<fake_token_around_image><row_r_col_c>`` and the image token
``image_seq_len`` times, a newline after each row, then a newline and the
global view as ``<fake_token_around_image><global-img>``, the image tokens and
``<fake_token_around_image>``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

LANCZOS = 1
MAX_IMAGE_SIZE = 4096
FAKE, GLOBAL = "<fake_token_around_image>", "<global-img>"


@dataclass(frozen=True)
class TileSettings:
    """One model's Idefics3 processing (module doc)."""

    longest_edge: int | None = 4 * 364  # None: no first resize
    tile: int = 364
    split: bool = True
    resample: int = LANCZOS
    rescale_factor: float | None = 1 / 255
    mean: tuple[float, ...] | None = (0.5, 0.5, 0.5)
    std: tuple[float, ...] | None = (0.5, 0.5, 0.5)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TileSettings:
        """From the image processor's saved keys (``size``, ``max_image_size``, ``do_image_splitting``, ...)."""
        size = config.get("size") or {}
        normalize = config.get("do_normalize", True)
        mean, std = config.get("image_mean", cls.mean), config.get("image_std", cls.std)
        return cls(
            longest_edge=int(size["longest_edge"]) if config.get("do_resize", True) and size else None,
            tile=int((config.get("max_image_size") or {}).get("longest_edge", cls.tile)),
            split=bool(config.get("do_image_splitting", True)),
            resample=int(config.get("resample", LANCZOS)),
            rescale_factor=float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None,
            mean=_triple(mean) if normalize and mean is not None else None,
            std=_triple(std) if normalize and std is not None else None,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TileSettings:
        """Inverse of ``to_dict``."""
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def key(self) -> str:
        """The settings as one string (part of an image's cache digest)."""
        return json.dumps(self.to_dict(), sort_keys=True)


def _triple(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in values) if isinstance(values, (list, tuple)) else (float(values),) * 3


def _to_longest(height: int, width: int, longest: int) -> tuple[int, int]:
    """The longest side to ``longest``, the other by the aspect ratio (made even), none over 4,096."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def _to_tiles(height: int, width: int, tile: int) -> tuple[int, int]:
    """Both sides rounded up to multiples of ``tile`` (the shorter by the aspect ratio first)."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def _resize(pixels: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    from PIL import Image

    if pixels.shape[:2] == (height, width):
        return pixels
    return np.asarray(Image.fromarray(pixels).resize((width, height), resample=resample))


def tiles(pixels: np.ndarray, settings: TileSettings) -> tuple[np.ndarray, int, int]:
    """RGB ``(h, w, 3)`` uint8 → frames ``(n, 3, tile, tile)`` float32 and the tile ``rows``, ``cols`` (module doc)."""
    if settings.longest_edge:
        pixels = _resize(
            pixels, *_to_longest(pixels.shape[0], pixels.shape[1], settings.longest_edge), settings.resample
        )
    t = settings.tile
    rows = cols = 0
    if settings.split:
        pixels = _resize(pixels, *_to_tiles(pixels.shape[0], pixels.shape[1], t), settings.resample)
        height, width = pixels.shape[:2]
        if height > t or width > t:
            rows, cols = (height - t) // t + 1, (width - t) // t + 1
            frames = [pixels[r * t : (r + 1) * t, c * t : (c + 1) * t] for r in range(rows) for c in range(cols)]
            frames.append(_resize(pixels, t, t, settings.resample))
        else:
            frames = [pixels]
    else:
        frames = [_resize(pixels, t, t, settings.resample)]
    out = np.stack([f.transpose(2, 0, 1) for f in frames])  # (n, 3, t, t) uint8
    if settings.rescale_factor is not None:
        values = (out.astype(np.float64) * settings.rescale_factor).astype(np.float32)
    else:
        values = out.astype(np.float32)
    if settings.mean is not None and settings.std is not None:
        mean = np.asarray(settings.mean, np.float32)[None, :, None, None]
        std = np.asarray(settings.std, np.float32)[None, :, None, None]
        values = ((values - mean) / std).astype(np.float32, copy=False)
    return np.ascontiguousarray(values), rows, cols


def placeholder(rows: int, cols: int, image_token: str, image_seq_len: int) -> str:
    """The text an image of ``rows`` x ``cols`` tiles stands as in its prompt (module doc)."""
    run = image_token * image_seq_len
    whole = f"{FAKE}{GLOBAL}{run}{FAKE}"
    if rows == 0 and cols == 0:
        return whole
    grid = "".join("".join(f"{FAKE}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n" for r in range(rows))
    return f"{grid}\n{whole}"
