"""The limits on a call's images and audio (``--max-images-per-request``, ``--max-image-pixels``, ...).

One ``MediaLimits`` per model, from its config (``shared.config``), travels
with the model's input stage; the decoders (``shared.inputs.media.decode``)
and the gateway's fetcher (``gateway.http.media_fetch``) enforce it and say
which flag to raise in their 400.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_IMAGE_PIXELS = 50_000_000  # about 7,000 x 7,000: past any page scan, far below a bomb


@dataclass(frozen=True)
class MediaLimits:
    """What one call's media may be (module doc)."""

    max_images_per_request: int = 16
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_media_bytes: int = 20 << 20  # one image's or clip's encoded bytes (Cohere v4's 20 MB)
    max_audio_seconds: float = 600.0
    allowed_media_domains: tuple[str, ...] = ()  # http(s) hosts a URL may name; empty: only data: URLs
    fetch_timeout_s: float = 5.0
    max_redirects: int = 3
