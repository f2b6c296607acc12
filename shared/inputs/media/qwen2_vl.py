"""The Qwen2-VL image processor (torch-free): dynamic resolution, then patches laid out for the vision tower.

An image keeps roughly its aspect ratio and is resized so that both sides are
multiples of ``patch_size * merge_size`` (28 for Qwen2-VL) and its area lies in
``[min_pixels, max_pixels]`` (``smart_resize``); that decides how many tokens it
costs. The resized pixels are rescaled and normalized in float32, the single
frame is repeated ``temporal_patch_size`` times, and the image is cut into
``grid_h * grid_w`` patches of ``C * T * P * P`` values each, ordered by merge
window (the ``merge_size`` x ``merge_size`` patches that become one token are
consecutive rows), as transformers' ``Qwen2VLImageProcessor`` lays them out.
``image_grid_thw`` is ``(1, grid_h, grid_w)``; the image holds
``grid_h * grid_w / merge_size**2`` tokens in its sequence.

``QwenImageSettings.from_config`` reads ``preprocessor_config.json``
(``min_pixels``/``max_pixels``, else ``size.shortest_edge``/``longest_edge``;
``patch_size``, ``merge_size``, ``temporal_patch_size``, ``resample``,
``rescale_factor``, ``image_mean``/``image_std``). Qwen3-VL and ColQwen2 use
the same processor with their own numbers.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from poolgate.shared.wire.media import IMAGE, MediaItem, digest_of

BICUBIC = 3
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT = 200


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (height, width) the processor resizes to: multiples of ``factor``, area within the bounds, the aspect
    ratio kept as well as that allows. ValueError for an image more than 200 times longer than wide (or the
    reverse)."""
    if min(height, width) <= 0 or max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"the image is {width}x{height}; its sides may differ by at most {MAX_ASPECT} times")
    # the nearest multiples first (Python's round: halves go to the even multiple)
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / shrink / factor) * factor)
        w = max(factor, math.floor(width / shrink / factor) * factor)
    elif h * w < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * grow / factor) * factor
        w = math.ceil(width * grow / factor) * factor
    return h, w


@dataclass(frozen=True)
class QwenImageSettings:
    """One model's Qwen2-VL-style processing (module doc)."""

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    resize: bool = True
    resample: int = BICUBIC
    rescale_factor: float | None = 1 / 255  # None: no rescale
    mean: tuple[float, ...] | None = CLIP_MEAN  # None: no normalize
    std: tuple[float, ...] | None = CLIP_STD

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QwenImageSettings:
        """From ``preprocessor_config.json``'s keys; ``min_pixels``/``max_pixels`` win over ``size``."""
        size = config.get("size") or {}
        min_pixels = config.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels") or cls.min_pixels
        max_pixels = config.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels") or cls.max_pixels
        normalize = config.get("do_normalize", True)
        mean, std = config.get("image_mean", CLIP_MEAN), config.get("image_std", CLIP_STD)
        return cls(
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
            patch_size=int(config.get("patch_size", cls.patch_size)),
            merge_size=int(config.get("merge_size", cls.merge_size)),
            temporal_patch_size=int(config.get("temporal_patch_size", cls.temporal_patch_size)),
            resize=bool(config.get("do_resize", True)),
            resample=int(config.get("resample", BICUBIC)),
            rescale_factor=float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None,
            mean=_triple(mean) if normalize else None,
            std=_triple(std) if normalize else None,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QwenImageSettings:
        """Inverse of ``to_dict`` (the settings as a plan receives them in ``TokenizerFiles.media``)."""
        fields = dict(data)
        for name in ("mean", "std"):
            if fields.get(name) is not None:
                fields[name] = tuple(fields[name])
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def key(self) -> str:
        """The settings as one string (part of an image's cache digest)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def out_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of that size is processed at; ValueError where it cannot be."""
        if self.resize:
            return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        if height % self.factor or width % self.factor:
            raise ValueError(
                f"the image is {width}x{height}; without resizing its sides must be multiples of {self.factor}"
            )
        return height, width

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """``image_grid_thw`` for an image of that size: one temporal step, its patch rows and columns."""
        h, w = self.out_size(height, width)
        return 1, h // self.patch_size, w // self.patch_size

    def tokens(self, height: int, width: int) -> int:
        """The image tokens an image of that size takes in its sequence."""
        t, gh, gw = self.grid(height, width)
        return t * gh * gw // (self.merge_size * self.merge_size)


def _triple(values: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in values) if isinstance(values, (list, tuple)) else (float(values),) * 3


def patches(pixels: np.ndarray, settings: QwenImageSettings) -> tuple[np.ndarray, np.ndarray]:
    """RGB ``(h, w, 3)`` uint8 → ``pixel_values`` ``(grid_h * grid_w, C * T * P * P)`` float32 and
    ``image_grid_thw`` ``(1, 3)`` int64 (module doc)."""
    from PIL import Image

    height, width = settings.out_size(pixels.shape[0], pixels.shape[1])
    if (height, width) != pixels.shape[:2]:
        pixels = np.asarray(Image.fromarray(pixels).resize((width, height), resample=settings.resample))
    image = pixels.transpose(2, 0, 1)  # channels first
    if settings.rescale_factor is not None:
        image = (image.astype(np.float64) * settings.rescale_factor).astype(np.float32)
    else:
        image = image.astype(np.float32)
    if settings.mean is not None and settings.std is not None:
        mean = np.asarray(settings.mean, np.float32)[:, None, None]
        std = np.asarray(settings.std, np.float32)[:, None, None]
        image = (image - mean) / std
    channels, p, m, t = image.shape[0], settings.patch_size, settings.merge_size, settings.temporal_patch_size
    grid_h, grid_w = height // p, width // p
    # (C, blocks down, m, P, blocks across, m, P) -> (blocks down, blocks across, m, m, C, P, P)
    blocks = image.reshape(channels, grid_h // m, m, p, grid_w // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    # the one frame repeated over the temporal patch, between the channel and the patch rows
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
    values = np.ascontiguousarray(frames.reshape(grid_h * grid_w, channels * t * p * p), dtype=np.float32)
    return values, np.array([[1, grid_h, grid_w]], dtype=np.int64)


def image_item(pixels: np.ndarray, settings: QwenImageSettings, meta: dict[str, Any] | None = None) -> MediaItem:
    """One decoded RGB image as the model reads it: ``pixel_values`` and ``image_grid_thw``, its token count and
    its digest (pixels + settings)."""
    values, grid = patches(pixels, settings)
    tokens = int(grid.prod()) // (settings.merge_size * settings.merge_size)
    info = {"width": int(pixels.shape[1]), "height": int(pixels.shape[0]), **(meta or {})}
    return MediaItem(
        IMAGE,
        {"pixel_values": values, "image_grid_thw": grid},
        digest_of(IMAGE, pixels, settings.key()),
        tokens,
        info,
    )
