"""``shared.inputs.media.images``: good images decoded as transformers reads them, bad ones a 400 and nothing else.

The reference for pixels is transformers itself: ``load_image``'s EXIF transpose and the processors'
``convert_to_rgb`` (white under transparency) on the image Pillow opened; the one deviation (16-bit grey
scaled, not clipped) is the module's doc and is checked here as such. Every image is made in the test.
"""
from __future__ import annotations

import base64
import io
import random
import time

import numpy as np
import pytest
from PIL import Image, ImageOps

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.inputs.media.images import FORMATS, decode_image, media_bytes, sniff
from poolgate.shared.wire.media import MediaRef

LIMITS = MediaLimits()
RNG = np.random.default_rng(7)
PHOTO = RNG.integers(0, 256, (24, 32, 3), dtype=np.uint8)


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def decode(data: bytes, limits: MediaLimits = LIMITS):
    return decode_image(MediaRef("image", data=data), limits, "input[0]")


def refused(data: bytes, limits: MediaLimits = LIMITS) -> str:
    with pytest.raises(InvalidRequest) as info:
        decode(data, limits)
    assert info.value.status == 400 and info.value.param == "input[0]"
    return info.value.message


def transformers_rgb(data: bytes) -> np.ndarray:
    """What transformers makes of the bytes: load_image's EXIF transpose, then convert_to_rgb."""
    from transformers.image_transforms import convert_to_rgb

    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    return convert_to_rgb(image, return_numpy=True)


PNG = encoded(Image.fromarray(PHOTO), "PNG")
JPEG = encoded(Image.fromarray(PHOTO), "JPEG", quality=90)


@pytest.mark.parametrize("fmt, options", [("PNG", {}), ("BMP", {}), ("TIFF", {}), ("WEBP", {"lossless": True}),
                                          ("GIF", {})])
def test_lossless_formats_decode_to_their_pixels(fmt, options):
    source = Image.fromarray(PHOTO).quantize(64).convert("RGB") if fmt == "GIF" else Image.fromarray(PHOTO)
    got = decode(encoded(source, fmt, **options))
    assert got.format == fmt and (got.height, got.width) == (24, 32)
    assert np.array_equal(got.pixels, np.asarray(source))


def reference_cases() -> dict[str, bytes]:
    grey = Image.fromarray(PHOTO[:, :, 0])
    rgba = Image.fromarray(np.dstack([PHOTO, RNG.integers(0, 256, (24, 32), dtype=np.uint8)]))
    palette = Image.fromarray(PHOTO).quantize(16)
    palette.info["transparency"] = 3
    keyed = Image.fromarray(PHOTO)
    rotated = Image.fromarray(PHOTO)
    exif = rotated.getexif()
    exif[0x0112] = 6  # rotate 90 degrees to display
    cases = {
        "jpeg": JPEG,
        "greyscale png": encoded(grey, "PNG"),
        "greyscale+alpha png": encoded(Image.merge("LA", [grey, grey.point(lambda v: 255 - v)]), "PNG"),
        "rgba png": encoded(rgba, "PNG"),
        "palette+transparency png": encoded(palette, "PNG", transparency=3),
        "rgb png with a transparent colour": encoded(keyed, "PNG", transparency=tuple(int(v) for v in PHOTO[0, 0])),
        "cmyk jpeg": encoded(Image.fromarray(PHOTO).convert("CMYK"), "JPEG", quality=95),
        "exif-rotated jpeg": encoded(rotated, "JPEG", quality=95, exif=exif),
        "1-bit bmp": encoded(grey.convert("1"), "BMP"),
        "rgba webp": encoded(rgba, "WEBP", lossless=True),
    }
    return cases


@pytest.mark.parametrize("name, data", list(reference_cases().items()))
def test_pixels_equal_transformers(name, data):
    got = decode(data)
    want = transformers_rgb(data)
    assert got.pixels.dtype == np.uint8 and got.pixels.shape == want.shape
    assert np.array_equal(got.pixels, want), name


def test_the_exif_orientation_is_applied_as_transformers_load_image_does():
    from transformers.image_utils import load_image

    data = reference_cases()["exif-rotated jpeg"]
    got = decode(data)
    assert (got.height, got.width) == (32, 24)  # turned upright: was 24 x 32 as stored
    assert np.array_equal(got.pixels, np.asarray(load_image(base64.b64encode(data).decode())))


def test_an_animated_gif_is_its_first_frame():
    frames = [Image.new("RGB", (8, 6), colour) for colour in ((255, 0, 0), (0, 0, 255), (0, 255, 0))]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert Image.open(io.BytesIO(data)).n_frames == 3
    got = decode(data)
    assert got.format == "GIF" and np.all(got.pixels == (255, 0, 0))


def test_a_16_bit_grey_png_is_scaled_not_clipped():
    deep = np.arange(0, 65536, 4096, dtype=np.uint16).reshape(4, 4)
    data = encoded(Image.fromarray(deep), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    got = decode(data)
    assert np.array_equal(got.pixels[:, :, 0], (deep >> 8).astype(np.uint8))
    assert np.array_equal(got.pixels[:, :, 0], got.pixels[:, :, 2])
    assert (transformers_rgb(data)[:, :, 0] == 255).sum() == 15  # (transformers clips all but the 0 to white)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A 30,000 x 30,000 PNG (900 million pixels) of under half a megabyte."""
    data = encoded(Image.new("1", (30000, 30000)), "PNG", compress_level=1)
    assert len(data) < 600_000
    return data


def test_a_30000_square_png_is_refused_at_once_never_decoded(bomb):
    start = time.perf_counter()
    message = refused(bomb)
    assert time.perf_counter() - start < 0.5
    assert message == ("input[0]: the image has 900,000,000 pixels (a decompression bomb), over this server's "
                       "--max-image-pixels 50,000,000")


def test_max_image_pixels_is_read_from_the_header():
    data = encoded(Image.new("1", (8000, 8000)), "PNG")
    assert len(data) < 20_000
    start = time.perf_counter()
    assert refused(data) == ("input[0]: the image is 8000 x 8000 = 64,000,000 pixels, over this server's "
                             "--max-image-pixels 50,000,000")
    assert time.perf_counter() - start < 0.5
    assert refused(PNG, MediaLimits(max_image_pixels=24 * 32 - 1)).endswith("--max-image-pixels 767")
    assert decode(PNG, MediaLimits(max_image_pixels=24 * 32)).width == 32


def svg() -> bytes:
    return b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"><rect/></svg>'


BAD = {
    "truncated png": (PNG[: len(PNG) // 2], "input[0]: the PNG image is truncated or corrupt (OSError: image file is"),
    "png with a broken data stream": (PNG[:60] + bytes(200) + PNG[260:], "input[0]: the PNG image is truncated or"),
    "png header only": (PNG[:8], "input[0]: the PNG image is corrupt (its header cannot be read)"),
    "truncated jpeg": (JPEG[: len(JPEG) // 2], "input[0]: the JPEG image is truncated or corrupt (OSError: image file"),
    "jpeg with garbage for a header": (JPEG[:3] + bytes(range(200)), "input[0]: the JPEG image is corrupt"),
    "pdf": (b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog >>\nendobj\n", "input[0]: image format PDF is not supported (send"),
    "ico": (encoded(Image.fromarray(PHOTO), "ICO"), "input[0]: image format ICO is not supported"),
    "svg": (svg(), "input[0]: image format SVG is not supported (send one of PNG, JPEG, WEBP, GIF, BMP, TIFF)"),
    "ppm (Pillow reads it; not served)": (encoded(Image.fromarray(PHOTO), "PPM"),
                                          "input[0]: not an image this server can read"),
    "wav audio as an image": (b"RIFF\x24\x00\x00\x00WAVEfmt ", "input[0]: image format WAV audio is not supported"),
    "text": (b"hello, I am not a picture", "input[0]: not an image this server can read (corrupt, or not one of PNG, JPEG"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_images_are_a_400_naming_why(name):
    data, message = BAD[name]
    assert refused(data).startswith(message), refused(data)


@pytest.mark.parametrize("url, message", [
    ("data:image/png;base64,", "input[0]: the image is empty"),
    ("data:image/png,rawbytes", "input[0]: only base64 data: URLs are supported"),
    ("data:image/png;base64", "input[0]: a data: URL needs a ',' before its data"),
    ("data:image/png;base64,@@@@", "input[0]: not valid base64"),
    ("file:///etc/passwd", "input[0]: a media URL must be a data: or http(s): URL"),
    ("https://example.com/a.png", "input[0]: image URLs are not fetched by this server"),
])
def test_bad_references_are_a_400(url, message):
    with pytest.raises(InvalidRequest) as info:
        decode_image(MediaRef("image", url=url), LIMITS, "input[0]")
    assert info.value.message.startswith(message)


def test_max_media_bytes_is_checked_before_the_base64_is_decoded():
    limits = MediaLimits(max_media_bytes=len(PNG) - 1)
    body = base64.b64encode(PNG).decode()
    for url in ("data:image/png;base64," + body, body, "data:image/png;base64," + body + "\n"):
        with pytest.raises(InvalidRequest, match="--max-media-bytes"):
            media_bytes(MediaRef("image", url=url), limits, "input[0]")
    huge = "A" * 40_000_000  # 30 MB once decoded: refused from its length alone
    start = time.perf_counter()
    with pytest.raises(InvalidRequest, match=r"about 30,000,000 bytes, over this server's 20,971,520 \(--max-media-bytes\)"):
        media_bytes(MediaRef("image", url=huge), LIMITS, "input[0]")
    assert time.perf_counter() - start < 0.5
    wrapped = "\n".join(body[i : i + 76] for i in range(0, len(body), 76))  # MIME line breaks do not count
    assert media_bytes(MediaRef("image", url=wrapped), MediaLimits(max_media_bytes=len(PNG)), "x") == PNG


def test_sniff_names_what_it_knows():
    assert [sniff(d) for d in (PNG, JPEG, svg(), b"%PDF-1", b"????")] == ["PNG", "JPEG", "SVG", "PDF", None]


def seeds() -> list[bytes]:
    image = Image.fromarray(PHOTO[:12, :16])
    out = [encoded(image, fmt) for fmt in ("PNG", "JPEG", "BMP", "TIFF", "GIF")]
    out.append(encoded(image, "WEBP", quality=80))
    out.append(encoded(image.convert("RGBA"), "PNG"))
    frames = [image, image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    out.append(encoded(frames[0], "GIF", save_all=True, append_images=frames[1:]))
    return out


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    if len(b) < 8:
        return data + rng.randbytes(rng.randint(1, 32))
    how = rng.randrange(6)
    if how == 0:  # flip some bytes
        for _ in range(rng.randint(1, 12)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif how == 1:  # cut it short
        del b[rng.randrange(1, len(b)) :]
    elif how == 2:  # insert junk
        at = rng.randrange(len(b))
        b[at:at] = rng.randbytes(rng.randint(1, 64))
    elif how == 3:  # a valid signature, then noise
        b = b[: rng.randint(2, 40)] + bytearray(rng.randbytes(rng.randint(0, 300)))
    elif how == 4:  # a header field (sizes live in the first bytes) made large
        at = rng.randrange(min(len(b), 64))
        b[at : at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\x00\x00\x00\x00", b"\x00\x01\x00\x00"])
    else:  # a slice repeated
        at, n = rng.randrange(len(b)), rng.randint(1, 200)
        b[at:at] = b[at : at + n] * rng.randint(2, 20)
    return bytes(b)


def test_fuzzed_bytes_give_an_image_or_a_400_and_nothing_else():
    rng = random.Random(20261203)
    base = seeds()
    outcomes = {"decoded": 0, "refused": 0}
    start = time.perf_counter()
    for _ in range(1500):
        data = mutate(rng.choice(base), rng)
        if rng.random() < 0.3:
            data = mutate(data, rng)
        try:
            got = decode(data, MediaLimits(max_image_pixels=1 << 20))
        except InvalidRequest as exc:
            assert exc.status == 400 and exc.message.startswith("input[0]: ")
            outcomes["refused"] += 1
        else:
            assert got.pixels.dtype == np.uint8 and got.pixels.ndim == 3 and got.pixels.shape[2] == 3
            assert got.format in FORMATS and got.height * got.width <= 1 << 20
            outcomes["decoded"] += 1
    assert outcomes["refused"] > 300 and outcomes["decoded"] > 100, outcomes  # both sides exercised
    assert time.perf_counter() - start < 60
    for data in (b"", b"\x00", bytes(1000), random.Random(1).randbytes(5000)):
        with pytest.raises(InvalidRequest):
            decode(data)
