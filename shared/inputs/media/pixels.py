"""The fixed-size image processors (CLIP, SigLIP, ViT, PaliGemma's SigLIP): resize, crop, rescale, normalize.

``PixelSettings.from_config`` reads a model's ``preprocessor_config.json`` (the
keys transformers' image processors save: ``size`` as ``shortest_edge`` or
``height``/``width``, ``resample`` as Pillow's number, ``crop_size``,
``rescale_factor``, ``image_mean``/``image_std``); ``pixel_values`` runs the
same steps on decoded RGB pixels with Pillow and numpy (no torch): resize in
uint8 with Pillow's filter, centre crop, then in float32 rescale and
normalize, channels first. Its output is what the worker's model reads as
``pixel_values`` ``(3, height, width)``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest

BICUBIC = 3


@dataclass(frozen=True)
class PixelSettings:
    """One model's fixed-size processing (module doc). ``shortest_edge``: resize the short side to it keeping the
    aspect ratio (CLIP); else ``height`` x ``width`` exactly (SigLIP, ViT)."""

    shortest_edge: int | None = None
    height: int | None = None
    width: int | None = None
    resample: int = BICUBIC
    crop_height: int | None = None  # None: no centre crop
    crop_width: int | None = None
    rescale_factor: float | None = 1 / 255  # None: no rescale
    mean: tuple[float, ...] | None = None  # None: no normalize
    std: tuple[float, ...] | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> PixelSettings:
        """From ``preprocessor_config.json``'s keys (module doc)."""
        size = config.get("size") or {}
        if isinstance(size, int):
            size = {"shortest_edge": size}
        crop = config.get("crop_size") or {}
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        resize = config.get("do_resize", True)
        normalize = config.get("do_normalize", True)
        return cls(
            shortest_edge=size.get("shortest_edge") if resize else None,
            height=size.get("height") if resize else None,
            width=size.get("width") if resize else None,
            resample=int(config.get("resample", BICUBIC)),
            crop_height=crop.get("height") if config.get("do_center_crop") else None,
            crop_width=crop.get("width") if config.get("do_center_crop") else None,
            rescale_factor=float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None,
            mean=tuple(config["image_mean"]) if normalize and config.get("image_mean") is not None else None,
            std=tuple(config["image_std"]) if normalize and config.get("image_std") is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def key(self) -> str:
        """The settings as one string (part of an image's cache digest)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def out_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) the processor gives an image of that size."""
        if self.crop_height and self.crop_width:
            return self.crop_height, self.crop_width
        return self._resized(height, width)

    def _resized(self, height: int, width: int) -> tuple[int, int]:
        if self.shortest_edge:
            short, long = (height, width) if height <= width else (width, height)
            new_long = int(self.shortest_edge * long / short)
            return (self.shortest_edge, new_long) if height <= width else (new_long, self.shortest_edge)
        if self.height and self.width:
            return self.height, self.width
        return height, width


def check_resize(settings: PixelSettings, height: int, width: int, max_pixels: int, where: str) -> None:
    """400 when the processor's resize of a ``height`` x ``width`` image would exceed ``max_pixels``: a short side
    resized up keeps the aspect ratio, so a 1 x 20,000 image would become 224 x 4,480,000 before its crop
    (seconds and gigabytes in the gateway) though the upload itself is under ``--max-image-pixels``."""
    new_height, new_width = settings._resized(height, width)
    if new_height * new_width > max_pixels:
        raise InvalidRequest(
            f"{where}: the image is {width} x {height}; this model's processor would resize it to {new_width} x "
            f"{new_height} = {new_height * new_width:,} pixels, over this server's --max-image-pixels "
            f"{max_pixels:,} (too extreme an aspect ratio)",
            param=where,
        )


def pixel_values(pixels: np.ndarray, settings: PixelSettings) -> np.ndarray:
    """RGB ``(h, w, 3)`` uint8 → ``(3, H, W)`` float32 as the model's processor makes it (module doc)."""
    from PIL import Image

    height, width = settings._resized(pixels.shape[0], pixels.shape[1])
    if (height, width) != pixels.shape[:2]:
        pixels = np.asarray(Image.fromarray(pixels).resize((width, height), resample=settings.resample))
    if settings.crop_height and settings.crop_width:
        pixels = _centre_crop(pixels, settings.crop_height, settings.crop_width)
    out = pixels.astype(np.float32)
    if settings.rescale_factor is not None:
        out = out * np.float32(settings.rescale_factor)
    if settings.mean is not None and settings.std is not None:
        mean, std = np.asarray(settings.mean, np.float32), np.asarray(settings.std, np.float32)
        out = ((out - mean) / std).astype(np.float32, copy=False)
    return np.ascontiguousarray(out.transpose(2, 0, 1), dtype=np.float32)


def _centre_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre ``height`` x ``width`` (padded with zeros where the image is smaller)."""
    h, w = pixels.shape[:2]
    if h < height or w < width:
        padded = np.zeros((max(h, height), max(w, width), pixels.shape[2]), pixels.dtype)
        top, left = (padded.shape[0] - h) // 2, (padded.shape[1] - w) // 2
        padded[top : top + h, left : left + w] = pixels
        pixels, h, w = padded, padded.shape[0], padded.shape[1]
    top, left = (h - height) // 2, (w - width) // 2
    return pixels[top : top + height, left : left + width]
