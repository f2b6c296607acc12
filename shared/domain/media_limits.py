"""The limits on a call's images and audio (``--max-images-per-request``, ``--max-image-pixels``, ...).

One ``MediaLimits`` per model, from its settings (``shared.config.model_flags.media_limits``:
``--allowed-media-domains``, ``--max-images-per-request``, ``--max-image-pixels``,
``--max-media-bytes``), travels with the model's input stage (``Front``); the
decoders (``shared.inputs.media.images``) and the gateway's fetcher
(``gateway.media_fetch``) enforce it and say which flag to raise in their 400.
``check_media_count`` counts a call's images and clips against
``--max-images-per-request`` (the gateway before it fetches any, the offline
API before it decodes any). ``media_host`` is the one spelling of a host name both the flag's values and a
URL's host are compared in: lower case, no trailing dot, IDNA (punycode), an
IPv6 address without brackets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.wire.media import MediaInput

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


def media_host(text: str) -> str:
    """``text`` (a host name or IP address) as ``allowed_media_domains`` holds it (module doc); ValueError for
    anything else: a URL, a port, a wildcard, credentials, an empty name."""
    host = text.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError(f"{text!r} is not a host name") from None
    labels = host.split(".")
    if not host or not all(label and all(c.isalnum() or c in "-_" for c in label) for label in labels):
        raise ValueError(
            f"{text!r} is not a host name or IP address (exact names only: no scheme, port, path or wildcard)"
        )
    return host


def check_media_count(inputs: Sequence[Any], limits: MediaLimits) -> int:
    """The images and audio clips of ``inputs`` (every ``MediaInput``'s), or a 400 naming
    ``--max-images-per-request`` when they are more than it allows."""
    n = sum(len(x.media) for x in inputs if isinstance(x, MediaInput))
    if n > limits.max_images_per_request:
        raise InvalidRequest(
            f"the request holds {n} images and audio clips, over this server's --max-images-per-request "
            f"{limits.max_images_per_request}",
            param="input",
        )
    return n
