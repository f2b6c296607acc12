"""Cohere v2 embed's images and v4 inputs as inputs to pool, and the image entries of its answer.

``images``: each a data URI (or bare base64), one input holding one image.
``inputs``: each ``{content: [parts]}``, its ``text`` and ``image_url`` parts
in order; one with an image is a ``MediaInput``, one of text only its text
items joined by a space (as before images were served). ``input_type``
``search_query`` / ``search_document`` name a ``MediaInput``'s role (query,
document); ``image`` is Cohere's type for images and applies no prompt. At
most ``MAX_INPUTS`` images or inputs per request, as Cohere allows.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings

from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel

from poolgate.gateway.dialects.media_parts import IMAGE_URL, TEXT, ContentPart, part_of, part_type
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import Input

ONE_OF = "Exactly one of texts, images, or inputs must be provided, and it must be non-empty"
MAX_INPUTS = 96
IMAGE_TYPE = "image"
ROLES = {"search_query": "query", "search_document": "document"}
HEADER_CHARS = 64 * 1024  # base64 characters read for an image's header before the whole is decoded
BIT_DEPTHS = {"1": 1, "I;16": 16, "I;16B": 16, "I;16L": 16, "I": 32, "F": 32}


class CohereInput(BaseModel):
    """One v4 input: its content parts (``text`` and ``image_url``) in order."""

    content: list[ContentPart]


def inputs_of(req: object) -> tuple[list[Input], list[str]]:
    """The request's inputs (``texts``, ``images`` or ``inputs``: exactly one, non-empty) and the texts to
    echo (``texts``, or each input's text)."""
    given = [name for name in ("texts", "images", "inputs") if getattr(req, name, None)]
    if len(given) != 1:
        raise InvalidRequest(ONE_OF, param="texts")
    texts: list[str] | None = getattr(req, "texts", None)
    if texts:
        return list(texts), list(texts)
    role = ROLES.get(getattr(req, "input_type", None) or "")
    images: list[str] | None = getattr(req, "images", None)
    if images:
        _check_count(len(images), "images")
        return [MediaInput(parts=(MediaRef("image", url=x),), role=role) for x in images], []
    items: list[CohereInput] = getattr(req, "inputs", None) or []
    _check_count(len(items), "inputs")
    inputs: list[Input] = []
    echo = []
    for i, item in enumerate(items):
        parts = [_part(p, f"inputs[{i}].content[{j}]") for j, p in enumerate(item.content)]
        text = " ".join(p for p in parts if isinstance(p, str))
        echo.append(text)
        media = any(isinstance(p, MediaRef) for p in parts)
        inputs.append(MediaInput(parts=tuple(parts), role=role) if media else text)
    return inputs, echo


def with_prompt(x: Input, prompt: str) -> Input:
    """``x`` prefixed with the model's prompt: a text's start, a ``MediaInput``'s first part."""
    if isinstance(x, MediaInput):
        return MediaInput(parts=(prompt, *x.parts), chat=x.chat, role=x.role)
    if not isinstance(x, str):  # (Cohere inputs are texts or MediaInputs)
        raise TypeError(f"cannot prompt {type(x).__name__}")
    return prompt + x


def _part(part: ContentPart, where: str) -> str | MediaRef:
    if part_type(part) not in (TEXT, IMAGE_URL):
        raise InvalidRequest(f"{where}: Cohere inputs take 'text' and 'image_url' parts", param=where)
    return part_of(part, where)


def _check_count(n: int, name: str) -> None:
    if n > MAX_INPUTS:
        raise InvalidRequest(f"{name}: at most {MAX_INPUTS} per request, got {n}", param=name)


def image_meta(url: str) -> dict | None:
    """An image's ``{width, height, format, bit_depth}`` from its header (a data URI or bare base64); None
    for one not given inline (an http(s) URL)."""
    if url.startswith(("http://", "https://")):
        return None
    body = url.partition(",")[2] if url.startswith("data:") else url
    text = "".join(body[: HEADER_CHARS + 1024].split())
    for chunk in (text[: len(text) // 4 * 4], "".join(body.split())):
        try:
            data = base64.b64decode(chunk + "=" * (-len(chunk) % 4))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                image = Image.open(io.BytesIO(data))
            width, height = image.size
            return {
                "width": width,
                "height": height,
                "format": (image.format or "").lower(),
                "bit_depth": BIT_DEPTHS.get(image.mode, 8),
            }
        except (binascii.Error, ValueError, OSError, UnidentifiedImageError, Image.DecompressionBombError):
            continue
    return None
