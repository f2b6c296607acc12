"""An image reference (``shared.wire.media.MediaRef``) to RGB pixels, with the guards a server needs.

``image_bytes`` reads a ``data:`` URL (base64 only), bare base64 (Cohere and
Jina send it so) or bytes already fetched by the gateway
(``gateway.media_fetch``); ``decode_image`` opens them with Pillow, reads only
the header first and refuses before decoding: an unknown or unsupported
format, more pixels than ``--max-image-pixels`` (a decompression bomb: a
30,000 × 30,000 PNG is a few hundred kilobytes), bytes past
``max_media_bytes``; then decodes (a truncated or corrupt file is a 400, never
a partial image) and converts to RGB (an alpha channel composited on white, as
the processors of these models do; palette and grey images expanded). Every
failure is an ``InvalidRequest`` naming the input and the part.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from dataclasses import dataclass

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.wire.media import MediaRef

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # what Pillow decodes here and clients send


@dataclass(frozen=True)
class DecodedImage:
    """An image's RGB pixels ``(height, width, 3)`` uint8 and what it was."""

    pixels: np.ndarray
    format: str

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])


def b64(data: str, where: str) -> bytes:
    """Strict base64 (whitespace and a missing padding tolerated), else a 400 naming ``where``."""
    text = "".join(data.split())
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{where}: not valid base64", param=where) from None


def media_bytes(ref: MediaRef, limits: MediaLimits, where: str) -> bytes:
    """The encoded bytes of ``ref``: fetched ones, a ``data:`` URL's (base64 only) or bare base64."""
    if ref.data is not None:
        data = ref.data
    elif ref.url.startswith("data:"):
        head, sep, body = ref.url.partition(",")
        if not sep:
            raise InvalidRequest(f"{where}: a data: URL needs a ',' before its data", param=where)
        if not head.endswith(";base64"):
            raise InvalidRequest(f"{where}: only base64 data: URLs are supported", param=where)
        data = b64(body, where)
    elif ref.url.startswith(("http://", "https://")):
        raise InvalidRequest(
            f"{where}: image URLs are not fetched by this server (send a data: URL or base64, or start it with "
            "--allowed-media-domains naming the host)",
            param=where,
        )
    elif ref.url.split(":", 1)[0].isalpha() and ":" in ref.url[:12]:
        raise InvalidRequest(f"{where}: a media URL must be a data: or http(s): URL", param=where)
    else:
        data = b64(ref.url, where)  # bare base64 (Cohere images without the data: prefix, Jina's image field)
    if not data:
        raise InvalidRequest(f"{where}: the {ref.kind} is empty", param=where)
    if len(data) > limits.max_media_bytes:
        raise InvalidRequest(
            f"{where}: the {ref.kind} has {len(data):,} bytes, over this server's {limits.max_media_bytes:,}",
            param=where,
        )
    return data


def decode_image(ref: MediaRef, limits: MediaLimits, where: str = "image") -> DecodedImage:
    """``ref`` as RGB pixels (module doc); ``where`` names it in the 400 (``input[2].content[1]``)."""
    from PIL import Image, UnidentifiedImageError

    data = media_bytes(ref, limits, where)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            fmt = (image.format or "").upper()
            if fmt not in FORMATS:
                raise InvalidRequest(
                    f"{where}: image format {fmt or 'unknown'} is not supported (send one of {', '.join(FORMATS)})",
                    param=where,
                )
            pixels = image.width * image.height
            if pixels > limits.max_image_pixels:
                raise InvalidRequest(
                    f"{where}: the image is {image.width} x {image.height} = {pixels:,} pixels, over this "
                    f"server's --max-image-pixels {limits.max_image_pixels:,}",
                    param=where,
                )
            image.load()
            rgb = _rgb(image)
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidRequest(f"{where}: the image is too large to decode (decompression bomb)", param=where) from None
    except UnidentifiedImageError:
        raise InvalidRequest(
            f"{where}: not an image this server can read (corrupt or unknown format)", param=where
        ) from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise InvalidRequest(f"{where}: the image is truncated or corrupt ({exc})", param=where) from None
    return DecodedImage(np.asarray(rgb, dtype=np.uint8), fmt)


def _rgb(image):  # type: ignore[no-untyped-def]
    """RGB, an alpha channel composited over white."""
    from PIL import Image

    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
