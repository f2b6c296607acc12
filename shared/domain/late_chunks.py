"""Late chunking's input (torch-free): one document encoded once, a vector per chunk (Jina's ``late_chunking``).

A ``LateChunkText`` is a document and where its chunks are: ``starts``, the
character offsets where chunks begin (strictly increasing, each inside the
text; chunk k runs to the next start, the last to the end; text before the
first start is context only), or ``chunk_tokens``, a chunk every that many
content tokens. The worker encodes the whole document as one sequence, takes
its token vectors (``token_embed``, before any normalization), and gives each
chunk the mean of the vectors of the tokens that start inside it, normalized.
The answer has one row per chunk and ``shared.domain.windows.Windows`` naming each
chunk's character span.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.tasks import PoolingTask

TOKEN_TASK: PoolingTask = "token_embed"  # whose raw token vectors late chunking averages


@dataclass(frozen=True)
class LateChunkText:
    """A document for late chunking: chunk ``starts`` (characters) or a chunk every ``chunk_tokens`` tokens."""

    text: str
    starts: list[int] | None = None
    chunk_tokens: int = 0


def check_late(doc: LateChunkText) -> None:
    """vLLM-style 400s for chunk boundaries the document cannot have."""
    if doc.starts is not None and doc.chunk_tokens:
        raise InvalidRequest("late chunking takes chunk boundaries or a chunk size, not both", param="chunk_boundaries")
    if doc.starts is None:
        if not isinstance(doc.chunk_tokens, int) or isinstance(doc.chunk_tokens, bool) or doc.chunk_tokens < 1:
            raise InvalidRequest(
                f"chunk_size must be a positive integer, got {doc.chunk_tokens!r}.", param="chunk_size"
            )
        return
    starts = doc.starts
    if not starts or not all(isinstance(s, int) and not isinstance(s, bool) for s in starts):
        raise InvalidRequest("chunk_boundaries must be a non-empty list of character offsets", param="chunk_boundaries")
    if any(b <= a for a, b in pairwise(starts)):
        raise InvalidRequest(f"chunk_boundaries must be strictly increasing, got {starts}.", param="chunk_boundaries")
    if starts[0] < 0 or starts[-1] >= len(doc.text):
        raise InvalidRequest(
            f"chunk_boundaries must lie inside the document (0 to {len(doc.text) - 1}), got {starts}.",
            param="chunk_boundaries",
        )
