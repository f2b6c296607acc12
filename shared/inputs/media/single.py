"""Inputs of one image or one clip each, the way classifiers read them (``image_classify``, ``audio_classify``).

``single_media`` walks a call's inputs and gives each one's only media part,
or a 400 naming the input: text (a string, token ids, a pair, a chat) where
the model reads images or audio, a part of the other kind, more than one
part, or text beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.inputs.encoded import Encoded
from poolgate.shared.wire.media import IMAGE, MediaInput, MediaItem, MediaRef
from poolgate.shared.wire.messages import Input

NOUN = {IMAGE: "images", "audio": "audio clips"}


def single_media(inputs: Iterable[Input], kind: str) -> list[tuple[str, MediaRef]]:
    """Each input's one ``kind`` part with the name a 400 gives it (``input[i]``); 400s per the module doc."""
    noun = NOUN[kind]
    refs = []
    for i, x in enumerate(inputs):
        where = f"input[{i}]"
        if not isinstance(x, MediaInput) or not x.media:
            raise InvalidRequest(f"{where}: this model reads {noun}, not text (send one per input)", param=where)
        media = x.media
        if any(isinstance(p, str) and p.strip() for p in x.parts):
            raise InvalidRequest(f"{where}: this model reads {noun} only; send the input without its text", param=where)
        if media[0].kind != kind:
            raise InvalidRequest(f"{where}: this model reads {noun}, not {NOUN[media[0].kind]}", param=where)
        if len(media) > 1:
            raise InvalidRequest(
                f"{where}: this model reads one {kind} per input, got {len(media)} media parts", param=where
            )
        refs.append((where, media[0]))
    return refs


def one_item_per_input(refs: list[tuple[str, MediaRef]], process: Callable[[str, MediaRef], MediaItem]) -> Encoded:
    """Each input as one sequence of its item's ``tokens`` placeholder ids (0), the item beside it."""
    items = [process(where, ref) for where, ref in refs]
    return Encoded(ids=[[0] * m.tokens for m in items], type_ids=[None] * len(items), media=[[m] for m in items])
