"""The image and audio parts every dialect takes, as ``shared.wire.media.MediaRef``s.

One content part (OpenAI / vLLM chat messages, vLLM's score ``{"content"}``
lists, Cohere v4 ``inputs``) is a ``ContentPart``; ``part_of`` reads it:

- ``{"type": "text", "text"}``: its text;
- ``{"type": "image_url", "image_url": {"url", "detail"?}}`` and vLLM's short
  form ``{"image_url": "<url>"}``: an image (``detail`` is read and not used);
- ``{"type": "input_audio", "input_audio": {"data": <base64>, "format"}}``
  (OpenAI's): an audio clip, rewritten as ``data:audio/{format};base64,...``
  with its format, as vLLM does;
- ``{"type": "audio_url", "audio_url": {"url"}}`` and ``{"audio_url": "<url>"}``
  (vLLM's): an audio clip.

Every media part may carry the client's ``uuid``. A URL is a ``data:`` URL
(base64), an ``http(s)`` URL (fetched only from the hosts
``--allowed-media-domains`` names) or, for Cohere and Jina, bare base64; the
input stage decodes it (``shared.inputs.media.images``). Precomputed
embeddings (``image_embeds``, ``audio_embeds``, ``video_embeds``,
``prompt_embeds``; vLLM serves them only with ``--enable-mm-embeds``) and
video are refused with a 400, as is any other part type, naming the part.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictStr

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.wire.media import AUDIO, IMAGE, MediaRef

TEXT, IMAGE_URL, INPUT_AUDIO, AUDIO_URL = "text", "image_url", "input_audio", "audio_url"
SERVED = (TEXT, IMAGE_URL, INPUT_AUDIO, AUDIO_URL)
EMBEDS = ("image_embeds", "audio_embeds", "video_embeds", "prompt_embeds")
SHORT_FORMS = (IMAGE_URL, AUDIO_URL, "video_url", *EMBEDS)  # vLLM reads a part without a type by these keys
AUDIO_FORMAT = re.compile(r"[a-z0-9]{1,16}")


class MediaURL(BaseModel):
    """``{"url", "detail"?}`` of an ``image_url`` or ``audio_url`` part."""

    model_config = ConfigDict(extra="allow")
    url: StrictStr
    detail: StrictStr | None = None


class InputAudio(BaseModel):
    """OpenAI's ``input_audio``: base64 data and its format (``wav``, ``flac``, ...)."""

    model_config = ConfigDict(extra="allow")
    data: StrictStr
    format: StrictStr


class ContentPart(BaseModel):
    """One part of a content list (module doc); other keys are kept and ignored."""

    model_config = ConfigDict(extra="allow")
    type: StrictStr | None = None
    text: StrictStr | None = None
    image_url: StrictStr | MediaURL | None = None
    audio_url: StrictStr | MediaURL | None = None
    input_audio: InputAudio | None = None
    uuid: StrictStr | None = None


def part_type(part: ContentPart) -> str:
    """The part's type: its ``type``, else the key of vLLM's short form; 400 when it has neither."""
    if part.type is not None:
        return part.type
    keys = [k for k in SHORT_FORMS if getattr(part, k, None) is not None or k in (part.model_extra or {})]
    if not keys:
        raise InvalidRequest("Missing 'type' field in multimodal part.", param="content")
    return keys[0]


def part_of(part: ContentPart, where: str, *, allow_missing_text: bool = False) -> str | MediaRef:
    """The part as text or a ``MediaRef``; a 400 naming ``where`` (e.g. ``messages[0].content[1]``) for a part
    poolgate does not serve. ``allow_missing_text``: a text part without ``text`` reads as "" (the chat
    routes have always read it so)."""
    kind = part_type(part)
    if kind == TEXT:
        if part.text is None and not allow_missing_text:
            raise InvalidRequest(f"{where}: a text part needs its 'text'", param=where)
        return part.text or ""
    if kind in (IMAGE_URL, AUDIO_URL):
        value = getattr(part, kind)
        url = value.url if isinstance(value, MediaURL) else value
        if not url:
            raise InvalidRequest(f"{where}: an {kind} part needs its URL ('{kind}': {{'url': ...}})", param=where)
        return MediaRef(IMAGE if kind == IMAGE_URL else AUDIO, url=url, uuid=part.uuid)
    if kind == INPUT_AUDIO:
        audio = part.input_audio
        if audio is None:
            raise InvalidRequest(f"{where}: an input_audio part needs 'input_audio': {{'data', 'format'}}", param=where)
        fmt = audio.format.lower()
        if not AUDIO_FORMAT.fullmatch(fmt):
            raise InvalidRequest(f"{where}: input_audio.format {audio.format[:40]!r} is not a format name", param=where)
        return MediaRef(AUDIO, url=f"data:audio/{fmt};base64,{audio.data}", format=fmt, uuid=part.uuid)
    if kind in EMBEDS:
        raise InvalidRequest(
            f"{where}: '{kind}' parts (precomputed embeddings) are not served; send the image or audio itself",
            param=where,
        )
    if kind == "video_url":
        raise InvalidRequest(f"{where}: video is not served; send images or audio", param=where)
    raise InvalidRequest(f"{where}: unknown content part type {kind[:40]!r}; served: {', '.join(SERVED)}", param=where)


def canonical(part: ContentPart, ref: str | MediaRef) -> dict[str, Any]:
    """The part as an OpenAI-style dict for a chat template: typed, short forms spelled out, the URL given."""
    if isinstance(ref, str):
        return {"type": TEXT, "text": ref}
    body = part.model_dump(exclude_none=True)
    kind = part_type(part)
    body["type"] = kind
    if kind in (IMAGE_URL, AUDIO_URL) and isinstance(getattr(part, kind), str):
        body[kind] = {"url": ref.url}
    return body


def has_media(parts: list[str | MediaRef]) -> bool:
    return any(isinstance(p, MediaRef) for p in parts)
