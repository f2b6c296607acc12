"""Images and audio on their way from a request to a model (torch-free): references, inputs, processed items.

A dialect turns a request's image and audio parts into ``MediaRef``s inside a
``MediaInput`` (one input: its text and media parts in order, and the chat it
came from where it came as one). The gateway resolves every ``http(s)``
reference to its bytes before the call is tokenized (only from the domains
``--allowed-media-domains`` allows), then, in its tokenizer pool, the model's
media plan (``shared.inputs.media``) decodes each reference (``data:`` URLs
here), runs the model's processor and turns the input into token ids with the
image's placeholder tokens and one ``MediaItem`` per image or clip: the
processor's arrays (pixel values, a Qwen2-VL grid, audio features), never the
file's bytes. A ``TokenCall`` carries each sequence's items
(``media_to_wire``/``media_from_wire``: their arrays ride as the frame's
arrays), and the worker's model reads them beside the token ids.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

IMAGE, AUDIO = "image", "audio"
MEDIA_KINDS = (IMAGE, AUDIO)


@dataclass(frozen=True)
class MediaRef:
    """One image or audio clip as the request named it: a ``data:`` URL or an ``http(s)`` URL (``url``), or its
    bytes once fetched or given bare (``data``; ``url`` then says where they came from). ``format``: what the
    request declared (``input_audio``'s ``wav``/``flac``; an image's is read from its bytes)."""

    kind: str
    url: str = ""
    data: bytes | None = None
    format: str | None = None
    uuid: str | None = None  # the client's own id for it (vLLM's media ``uuid``); informational

    def __post_init__(self) -> None:
        if self.kind not in MEDIA_KINDS:
            raise ValueError(f"unknown media kind {self.kind!r}")

    @property
    def remote(self) -> bool:
        """An ``http(s)`` reference whose bytes are not fetched yet."""
        return self.data is None and self.url.startswith(("http://", "https://"))


Part = str | MediaRef


@dataclass(frozen=True)
class MediaInput:
    """One input of text and media parts in order (one vector, or one document to score). ``chat``: the
    OpenAI-style messages it came from (their ``image_url``/``input_audio`` parts in place), for models whose
    chat template places the media tokens; ``role``: ``query`` or ``document`` where the dialect says
    (a ColPali query is text with its own prefix; a page is an image)."""

    parts: tuple[Part, ...]
    chat: tuple[dict[str, Any], ...] | None = None
    role: str | None = None
    # a chat's options (vLLM's): honoured by a plan whose model renders its chat template, else refused
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def chat_options(self) -> list[str]:
        """The chat options set away from their defaults, by name."""
        names = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs")
        return [n for n in names if getattr(self, n)]

    @property
    def media(self) -> list[MediaRef]:
        return [p for p in self.parts if isinstance(p, MediaRef)]

    @property
    def text(self) -> str:
        """Its text parts joined by newlines (what a text-only reading of it sees)."""
        return "\n".join(p for p in self.parts if isinstance(p, str))

    @property
    def kinds(self) -> set[str]:
        """``text`` and the media kinds it holds."""
        return {p.kind if isinstance(p, MediaRef) else "text" for p in self.parts}


@dataclass(frozen=True, eq=False)
class MediaItem:
    """One image or clip after the model's processor: ``arrays`` by the name the model reads them
    (``pixel_values``, ``image_grid_thw``, ``input_values``, ...), ``tokens`` the placeholder tokens it holds in
    its sequence (its cost in the token budget), ``digest`` the sha256 of the decoded pixels or samples and the
    processor's settings (the embedding cache's key for it), ``meta`` what responses report (width, height,
    format, seconds)."""

    kind: str
    arrays: dict[str, np.ndarray]
    digest: str
    tokens: int
    meta: dict[str, Any] = field(default_factory=dict)


def digest_of(kind: str, data: np.ndarray, settings: str = "") -> str:
    """The sha256 of decoded media (its pixels or samples, shape and dtype) and the processor's ``settings``."""
    h = hashlib.sha256(f"{kind}|{data.dtype.str}|{data.shape}|{settings}|".encode())
    h.update(np.ascontiguousarray(data).data)
    return h.hexdigest()


SequenceMedia = list[MediaItem] | None  # one sequence's items in order, None when it holds none


def media_to_wire(media: list[SequenceMedia]) -> tuple[list[Any], list[np.ndarray]]:
    """Per sequence its items' headers (kind, digest, tokens, meta, array names) or None; their arrays in order."""
    header: list[Any] = []
    arrays: list[np.ndarray] = []
    for items in media:
        if items is None:
            header.append(None)
            continue
        header.append(
            [
                {"kind": m.kind, "digest": m.digest, "tokens": m.tokens, "meta": m.meta, "arrays": list(m.arrays)}
                for m in items
            ]
        )
        for m in items:
            arrays += [np.ascontiguousarray(a) for a in m.arrays.values()]
    return header, arrays


def media_from_wire(header: list[Any], arrays: list[np.ndarray]) -> list[SequenceMedia]:
    """Inverse of ``media_to_wire``; ValueError where the arrays do not match the headers."""
    blocks = iter(arrays)
    media: list[SequenceMedia] = []
    try:
        for items in header:
            if items is None:
                media.append(None)
                continue
            media.append(
                [
                    MediaItem(
                        h["kind"],
                        {name: next(blocks) for name in h["arrays"]},
                        str(h["digest"]),
                        int(h["tokens"]),
                        dict(h.get("meta") or {}),
                    )
                    for h in items
                ]
            )
    except (StopIteration, KeyError, TypeError) as exc:
        raise ValueError(f"malformed media in the call: {exc!r}") from None
    if next(blocks, None) is not None:
        raise ValueError("the call carries more media arrays than its media name")
    return media
