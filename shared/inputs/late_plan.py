"""Late chunking in the worker: each chunk's tokens in its document's sequence, then their mean vector.

``plan`` runs in the input stage, after the documents (``LateChunkText``) are
tokenized as plain texts: it finds each document's content tokens in its
sequence (the run between the special tokens), gives each chunk the tokens
whose first character lies inside it (``starts``) or every ``chunk_tokens``
tokens, and refuses a chunk left with no token (a boundary inside one token,
or past a truncation). The engine runs each document as ONE sequence with
``token_embed`` and ``use_activation`` off (the raw token vectors), then
``LatePlan.fold`` turns its token rows into one row per chunk: the mean of
the chunk's token vectors, L2-normalized.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.late_chunks import TOKEN_TASK, LateChunkText
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.windows import Windows
from poolgate.shared.wire.rows import Rows

Span = tuple[int, int]


class SpanEncoder(Protocol):
    """What ``plan`` needs of the model's encoder (``runner_api.TextEncoder`` has it; named here so this module,
    which ``runner_api`` names, imports nothing of the engine's back)."""

    def token_spans(self, text: str) -> tuple[str, list[Span]]: ...

    def encode(
        self, texts: list[str], max_tokens: int | None = None, *, add_special_tokens: bool = True
    ) -> list[list[int]]: ...


@dataclass(frozen=True)
class LatePlan:
    """Per document: its sequence's length, and each chunk's token positions and character span."""

    params: PoolingParams  # what each document's sequence runs with: raw token vectors
    lengths: list[int]
    ranges: list[list[Span]]
    spans: list[list[Span]]

    def fold(self, rows: Rows) -> tuple[Rows, Windows]:
        """(chunks, dim) normalized chunk means from the documents' token rows, and the chunks' spans."""
        vectors = []
        for i, ranges in enumerate(self.ranges):
            block = rows.item(i)  # (T, dim)
            if len(block) != self.lengths[i]:
                raise InvalidRequest(
                    "late chunking needs one vector per token, and this model's token vectors leave tokens out",
                    param="late_chunking",
                )
            for a, b in ranges:
                mean = block[a:b].astype(np.float64).mean(axis=0)  # (dim,)
                vectors.append(mean / max(np.linalg.norm(mean), 1e-12))
        counts = tuple(len(r) for r in self.ranges)
        return Rows(np.asarray(vectors, dtype=np.float32)), Windows(counts, tuple(s for d in self.spans for s in d))


def plan(encoder: SpanEncoder, docs: list[LateChunkText], ids: list[list[int]], params: PoolingParams) -> LatePlan:
    """The chunks of each document, given its sequence's ``ids`` (tokenized with special tokens)."""
    ranges, spans = [], []
    for doc, seq in zip(docs, ids, strict=True):
        text, offsets = encoder.token_spans(doc.text)
        first, kept = _content_run(encoder.encode([doc.text], add_special_tokens=False)[0], seq)
        offsets = offsets[:kept]
        doc_ranges, doc_spans = (
            _by_tokens(offsets, doc.chunk_tokens) if doc.starts is None else _by_starts(offsets, doc.starts, len(text))
        )
        ranges.append([(first + a, first + b) for a, b in doc_ranges])
        spans.append(doc_spans)
    raw = replace(params, task=TOKEN_TASK, use_activation=False, dimensions=None)
    return LatePlan(raw, [len(s) for s in ids], ranges, spans)


def _content_run(content: list[int], seq: list[int]) -> tuple[int, int]:
    """Where the text's own tokens start in ``seq`` and how many of them it kept (truncation)."""
    for k in range(len(seq)):
        run = 0
        while run < len(content) and k + run < len(seq) and seq[k + run] == content[run]:
            run += 1
        if run:
            return k, run
    return 0, 0


def _by_starts(offsets: list[Span], starts: list[int], length: int) -> tuple[list[Span], list[Span]]:
    token_starts = [o[0] for o in offsets]
    ends = [*starts[1:], length]
    ranges = [
        (bisect.bisect_left(token_starts, s), bisect.bisect_left(token_starts, e))
        for s, e in zip(starts, ends, strict=True)
    ]
    for k, (a, b) in enumerate(ranges):
        if a == b:
            raise InvalidRequest(
                f"chunk {k} (characters {starts[k]} to {ends[k]}) holds no token of the document "
                "as read (a boundary inside one token, or past a truncation)",
                param="chunk_boundaries",
            )
    return ranges, list(zip(starts, ends, strict=True))


def _by_tokens(offsets: list[Span], size: int) -> tuple[list[Span], list[Span]]:
    if not offsets:
        raise InvalidRequest("late chunking needs a document with at least one token", param="input")
    ranges = [(a, min(a + size, len(offsets))) for a in range(0, len(offsets), size)]
    return ranges, [(offsets[a][0], offsets[b - 1][1]) for a, b in ranges]
