"""The call a worker runs: its sequences' token ids as one int32 block plus offsets, how to pool them, by when.

The gateway (or the offline API) tokenizes a ``PoolingCall`` in front of the
queue (``shared.inputs``) and sends this: every sequence's ids back to back in
one ``(total,)`` int32 array, ``offsets`` ``(n + 1,)`` int64 where sequence
``i`` is ``ids[offsets[i]:offsets[i + 1]]``, and where a sequence needs them
its token type ids (a cross-encoder's pairs) and its attended keys (a PyLate
query's expansion) as blocks of the same length. Over the transport the
blocks are the frame's arrays, never JSON lists; the header carries the rest
(params, deadline, priority, lane: ``shared.domain.lanes``). The worker's
answer has one row (and one token count) per sequence.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poolgate.shared.domain.lanes import LIVE, Lane, lane_of
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.media import SequenceMedia, media_from_wire, media_to_wire

IDS = np.dtype(np.int32)


@dataclass(frozen=True, eq=False)
class TokenCall:
    """One tokenized call (module doc)."""

    request_id: str
    model: str
    ids: np.ndarray  # (total,) int32
    offsets: np.ndarray  # (n + 1,) int64
    params: PoolingParams = field(default_factory=PoolingParams)
    type_ids: np.ndarray | None = None  # (total,) int8; None: every token is segment 0
    attend: np.ndarray | None = None  # (total,) bool; None: every token is a key
    deadline: float | None = None  # unix time; None = no deadline
    priority: int = 0
    trace_context: dict[str, str] = field(default_factory=dict)
    lane: Lane = LIVE  # bulk: below every live call (shared.domain.lanes)
    media: list[SequenceMedia] | None = None  # per sequence its images/clips (shared.wire.media); None: text only

    @classmethod
    def pack(
        cls,
        request_id: str,
        model: str,
        sequences: list[list[int]],
        *,
        type_ids: list[list[int] | None] | None = None,
        attend: list[list[bool] | None] | None = None,
        media: list[SequenceMedia] | None = None,
        **rest: Any,
    ) -> TokenCall:
        """The call of ``sequences`` (ids lists) and, per sequence, its type ids and keys (None: the default)."""
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        ids = np.fromiter(itertools.chain.from_iterable(sequences), dtype=IDS, count=total)
        types = _block(type_ids, lengths, np.int8, 0)
        keys = _block(attend, lengths, np.bool_, True)
        if media is not None and all(m is None for m in media):
            media = None
        if media is not None and len(media) != len(sequences):
            raise ValueError("media must name each sequence's items (None for a sequence without)")
        return cls(request_id, model, ids, offsets, type_ids=types, attend=keys, media=media, **rest)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> list[int]:
        """Each sequence's token count."""
        return np.diff(self.offsets).tolist()

    def sequences(self) -> list[list[int]]:
        """Each sequence's ids as a list."""
        return [self.ids[a:b].tolist() for a, b in itertools.pairwise(self.offsets.tolist())]

    def type_lists(self) -> list[list[int] | None]:
        """Each sequence's token type ids (None where all are 0)."""
        return _lists(self.type_ids, self.offsets, 0)

    def attend_lists(self) -> list[list[bool] | None]:
        """Each sequence's attended keys (None where every token is one)."""
        return _lists(self.attend, self.offsets, True)

    def media_lists(self) -> list[SequenceMedia]:
        """Each sequence's media items (None where it holds none)."""
        return list(self.media) if self.media is not None else [None] * len(self)

    def to_wire(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        """The header fields and the blocks (ids, offsets, then type ids and keys where present)."""
        header: dict[str, Any] = {
            "request_id": self.request_id,
            "model": self.model,
            "params": self.params.to_wire(),
            "deadline": self.deadline,
            "priority": self.priority,
            "lane": self.lane,
            "trace_context": self.trace_context,
            "type_ids": self.type_ids is not None,
            "attend": self.attend is not None,
        }
        arrays = [self.ids, self.offsets, *(a for a in (self.type_ids, self.attend) if a is not None)]
        if self.media is not None:
            header["media"], blocks = media_to_wire(self.media)
            arrays += blocks
        return header, arrays

    @classmethod
    def from_wire(cls, header: dict[str, Any], arrays: list[np.ndarray]) -> TokenCall:
        """Inverse of ``to_wire``; ValueError for blocks that do not fit together or an unknown lane."""
        blocks = iter(arrays)
        ids, offsets = next(blocks), next(blocks)
        types = next(blocks) if header["type_ids"] else None
        attend = next(blocks) if header["attend"] else None
        if ids.dtype != IDS or ids.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1:
            raise ValueError("token ids must be one int32 block with its offsets")
        if offsets[0] != 0 or offsets[-1] != len(ids) or np.any(np.diff(offsets) < 0):
            raise ValueError("the offsets do not cover the token ids")
        if any(a is not None and a.shape != ids.shape for a in (types, attend)):
            raise ValueError("token type ids and keys must be as long as the token ids")
        media = media_from_wire(header["media"], list(blocks)) if header.get("media") is not None else None
        if media is not None and len(media) != len(offsets) - 1:
            raise ValueError("the call's media do not name one entry per sequence")
        return cls(
            header["request_id"],
            header["model"],
            ids,
            offsets.astype(np.int64, copy=False),
            PoolingParams.from_wire(header["params"]),
            types,
            attend,
            header.get("deadline"),
            int(header.get("priority") or 0),
            dict(header.get("trace_context") or {}),
            lane_of(header.get("lane")),  # absent (an older gateway): live
            media,
        )


def _block(per_seq: list[Any] | None, lengths: np.ndarray, dtype: type, default: int | bool) -> np.ndarray | None:
    """Per-sequence lists (None: all ``default``) as one block; None when every sequence is the default."""
    if per_seq is None or all(x is None for x in per_seq):
        return None
    parts = [
        np.full(n, default, dtype) if x is None else np.asarray(x, dtype) for x, n in zip(per_seq, lengths, strict=True)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _lists(block: np.ndarray | None, offsets: np.ndarray, default: int | bool) -> list[Any]:
    """Inverse of ``_block``: each sequence's slice as a list, None where it is all ``default``."""
    n = len(offsets) - 1
    if block is None:
        return [None] * n
    out: list[Any] = []
    for a, b in itertools.pairwise(offsets.tolist()):
        piece = block[a:b]
        out.append(None if bool(np.all(piece == default)) else piece.tolist())
    return out
