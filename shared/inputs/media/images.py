"""An image reference (``shared.wire.media.MediaRef``) to RGB pixels, with the guards a server needs.

``media_bytes`` reads a ``data:`` URL (base64 only), bare base64 (Cohere and
Jina send it so) or bytes already fetched by the gateway
(``gateway.media_fetch``), refusing more than ``--max-media-bytes`` before
decoding the base64. ``decode_image`` opens them with Pillow's parsers for
``FORMATS`` only (no other parser sees a client's bytes), reads the header
first and refuses before decoding: a format not in ``FORMATS`` (named when its
signature is known: PDF, SVG, ICO, HEIC, ...), more pixels than
``--max-image-pixels`` (a decompression bomb: a 30,000 × 30,000 PNG is a few
hundred kilobytes; Pillow's own limit, about 179 million pixels, holds above
any flag). Then it decodes the first frame (an animated GIF, PNG or WebP: its
first; a truncated or corrupt file is a 400, never a partial image) and turns
it into RGB as transformers does: the EXIF orientation applied
(``transformers.image_utils.load_image``: ``ImageOps.exif_transpose``), then
``convert_to_rgb`` (an alpha band or a transparency key composited over
white; palette, greyscale, CMYK converted by Pillow). One deviation: a 16-bit
greyscale image (``I;16``) is scaled to 8 bits (its high byte, as Pillow reads
a 16-bit colour PNG), where Pillow's ``convert("RGB")``, and so transformers,
clips every value over 255 to white. Every failure is an ``InvalidRequest``
naming the input and the part; nothing else leaves here for any bytes
(tests/shared/inputs/test_images.py fuzzes it).
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.wire.media import MediaRef

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # what Pillow decodes here and clients send
ORIENTATION = 0x0112  # the EXIF tag exif_transpose reads

# leading bytes -> the format they start, for the 400's wording (Pillow only ever tries FORMATS)
SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "PNG"),
    (b"\xff\xd8\xff", 0, "JPEG"),
    (b"GIF87a", 0, "GIF"),
    (b"GIF89a", 0, "GIF"),
    (b"WEBP", 8, "WEBP"),
    (b"BM", 0, "BMP"),
    (b"II*\x00", 0, "TIFF"),
    (b"MM\x00*", 0, "TIFF"),
    (b"%PDF", 0, "PDF"),
    (b"\x00\x00\x01\x00", 0, "ICO"),
    (b"\x00\x00\x02\x00", 0, "CUR"),
    (b"8BPS", 0, "PSD"),
    (b"ftypheic", 4, "HEIC"),
    (b"ftypheix", 4, "HEIC"),
    (b"ftypmif1", 4, "HEIF"),
    (b"ftypavif", 4, "AVIF"),
    (b"\xff\x0a", 0, "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", 0, "JPEG XL"),
    (b"qoif", 0, "QOI"),
    (b"\x00\x00\x00\x0cjP  ", 0, "JPEG 2000"),
    (b"WAVE", 8, "WAV audio"),
    (b"fLaC", 0, "FLAC audio"),
)


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
        data = b64(_capped(body, ref, limits, where), where)
    elif ref.url.startswith(("http://", "https://")):
        raise InvalidRequest(
            f"{where}: image URLs are not fetched by this server (send a data: URL or base64, or start it with "
            "--allowed-media-domains naming the host)",
            param=where,
        )
    elif ref.url.split(":", 1)[0].isalpha() and ":" in ref.url[:12]:
        raise InvalidRequest(f"{where}: a media URL must be a data: or http(s): URL", param=where)
    else:  # bare base64 (Cohere images without the data: prefix, Jina's image field)
        data = b64(_capped(ref.url, ref, limits, where), where)
    if not data:
        raise InvalidRequest(f"{where}: the {ref.kind} is empty", param=where)
    if len(data) > limits.max_media_bytes:
        raise _too_many_bytes(ref, len(data), limits, where)
    return data


def _capped(text: str, ref: MediaRef, limits: MediaLimits, where: str) -> str:
    """``text`` when its base64 can hold no more than ``--max-media-bytes`` (checked before decoding it)."""
    if len(text) // 4 * 3 <= limits.max_media_bytes:
        return text
    n = (len(text) - sum(text.count(c) for c in " \t\r\n")) // 4 * 3
    if n > limits.max_media_bytes + 2:
        raise _too_many_bytes(ref, n, limits, where, about=True)
    return text


def _too_many_bytes(ref: MediaRef, n: int, limits: MediaLimits, where: str, about: bool = False) -> InvalidRequest:
    return InvalidRequest(
        f"{where}: the {ref.kind} has {'about ' if about else ''}{n:,} bytes, over this server's "
        f"{limits.max_media_bytes:,} (--max-media-bytes)",
        param=where,
    )


def sniff(data: bytes) -> str | None:
    """The format ``data`` starts like (``SIGNATURES``; SVG for XML or ``<svg``), or None."""
    for magic, at, name in SIGNATURES:
        if data[at : at + len(magic)] == magic:
            return name
    head = data[:256].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<svg", b"<?xml")) or b"<svg" in head:
        return "SVG"
    return None


def decode_image(ref: MediaRef, limits: MediaLimits, where: str = "image") -> DecodedImage:
    """``ref`` as RGB pixels (module doc); ``where`` names it in the 400 (``input[2].content[1]``)."""
    from PIL import Image, UnidentifiedImageError

    data = media_bytes(ref, limits, where)
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
        fmt = (image.format or "").upper()
        pixels = image.width * image.height
        if pixels > limits.max_image_pixels:
            raise InvalidRequest(
                f"{where}: the image is {image.width} x {image.height} = {pixels:,} pixels, over this "
                f"server's --max-image-pixels {limits.max_image_pixels:,}",
                param=where,
            )
        image.load()
        rgb = _rgb(_upright(image))
    except InvalidRequest:
        raise
    except Image.DecompressionBombError as exc:  # past Pillow's own limit: refused as the image was opened
        said = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{int(said.group(1)):,}" if said else f"more than {2 * (Image.MAX_IMAGE_PIXELS or 0):,}"
        raise InvalidRequest(
            f"{where}: the image has {size} pixels (a decompression bomb), over this server's "
            f"--max-image-pixels {limits.max_image_pixels:,}",
            param=where,
        ) from None
    except UnidentifiedImageError:
        raise _unreadable(data, where) from None
    except Exception as exc:  # any failure of Pillow's parsers on a client's bytes is that input's fault
        raise InvalidRequest(
            f"{where}: the {_named(data)}image is truncated or corrupt ({type(exc).__name__}: {str(exc)[:120]})",
            param=where,
        ) from None
    return DecodedImage(rgb, fmt)


def _named(data: bytes) -> str:
    name = sniff(data)
    return f"{name} " if name in FORMATS else ""


def _unreadable(data: bytes, where: str) -> InvalidRequest:
    """The 400 for bytes no parser of ``FORMATS`` took: a format named, a corrupt header, or not an image."""
    name, sent = sniff(data), ", ".join(FORMATS)
    if name is None:
        return InvalidRequest(
            f"{where}: not an image this server can read (corrupt, or not one of {sent})", param=where
        )
    if name in FORMATS:
        return InvalidRequest(f"{where}: the {name} image is corrupt (its header cannot be read)", param=where)
    return InvalidRequest(f"{where}: image format {name} is not supported (send one of {sent})", param=where)


def _upright(image):  # type: ignore[no-untyped-def]
    """The image turned as its EXIF orientation says (transformers' ``load_image``); itself when it says none."""
    from PIL import ImageOps

    if image.getexif().get(ORIENTATION, 1) in (None, 1):
        return image
    return ImageOps.exif_transpose(image)


def _rgb(image) -> np.ndarray:  # type: ignore[no-untyped-def]
    """RGB uint8 as transformers' ``convert_to_rgb`` makes it (module doc), a 16-bit grey image scaled."""
    from PIL import Image

    if image.mode.startswith("I;16") or image.mode == "I":
        grey = np.asarray(image, dtype=np.int64) if image.mode == "I" else np.asarray(image).astype(np.int64)
        eight = (np.clip(grey, 0, 65535) >> 8).astype(np.uint8)
        return np.repeat(eight[:, :, None], 3, axis=2)
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.asarray(Image.alpha_composite(white, rgba).convert("RGB"), dtype=np.uint8)
    return np.asarray(image.convert("RGB"), dtype=np.uint8)
