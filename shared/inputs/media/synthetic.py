"""Synthetic images and audio, made here: ``poolgate verify``'s probe set and the image benchmark's inputs.

Deterministic (seeded), no files: gradients, noise, flat colours, text-like
stripes, odd sizes and aspect ratios, an alpha channel, palette and greyscale
modes, as PNG, JPEG, WEBP and GIF, so a check exercises what real uploads
hold; ``data_url`` wraps bytes as a ``data:`` URL; ``tone_wav`` is a WAV clip
of tones and noise for the audio models.
"""

from __future__ import annotations

import base64
import io
import wave

import numpy as np


def _png(image: object, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)  # type: ignore[attr-defined]
    return out.getvalue()


def probe_images(seed: int = 0) -> list[tuple[str, bytes]]:
    """(name, encoded bytes) of the probe set (module doc)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:224, 0:224]
    gradient = np.stack([x, y, (x + y) // 2], -1).astype(np.uint8)
    noise = rng.integers(0, 256, (301, 451, 3), dtype=np.uint8)
    stripes = np.where((np.arange(640)[None, :, None] // 7) % 2 == 0, 20, 235).repeat(480, 0).astype(np.uint8)
    stripes = np.broadcast_to(stripes, (480, 640, 3)).copy()
    tall = rng.integers(0, 256, (900, 120, 3), dtype=np.uint8)
    rgba = np.concatenate([noise[:128, :128], rng.integers(0, 256, (128, 128, 1), dtype=np.uint8)], -1)
    return [
        ("gradient 224x224 png", _png(Image.fromarray(gradient))),
        ("noise 451x301 jpeg", _png(Image.fromarray(noise), "JPEG")),
        ("stripes 640x480 webp", _png(Image.fromarray(stripes), "WEBP")),
        ("tall 120x900 png", _png(Image.fromarray(tall))),
        ("flat 32x32 png", _png(Image.new("RGB", (32, 32), (200, 30, 60)))),
        ("alpha 128x128 png", _png(Image.fromarray(rgba, "RGBA"))),
        ("grey 200x150 png", _png(Image.fromarray(noise[:150, :200, 0], "L"))),
        ("palette 96x96 gif", _png(Image.fromarray(gradient[:96, :96]).convert("P"), "GIF")),
    ]


def bench_image(size: int, seed: int) -> bytes:
    """One ``size`` x ``size`` PNG of smooth colour and noise (a benchmark input; each seed differs)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    base = np.stack([x * 255 // max(size - 1, 1), y * 255 // max(size - 1, 1), np.full_like(x, seed % 256)], -1)
    pixels = np.clip(base + rng.integers(-24, 25, base.shape), 0, 255).astype(np.uint8)
    return _png(Image.fromarray(pixels))


def tone_wav(seconds: float = 1.0, rate: int = 16000, seed: int = 0) -> bytes:
    """A 16-bit mono WAV clip: two tones and a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    signal = 0.4 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 1234 * t) + 0.02 * rng.standard_normal(len(t))
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    """``data`` as a base64 ``data:`` URL."""
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
