"""Fixed shapes for CUDA graphs: token buckets, and a packed batch padded to one graph's shape (host side).

A CUDA graph replays kernels recorded for fixed tensor shapes and fixed
launch arguments, so a batch it runs must have exactly the shapes it was
captured with: ``rows`` token rows (a token bucket, ``token_buckets``),
``seqs + 1`` entries of ``cu_seqlens`` (a power of two of sequences) and one
``max_len`` (varlen flash attention takes the longest sequence as a launch
argument; a power of two at least the batch's longest, at most the model's
longest input). ``graph_batch`` adds the rows up to the bucket as dummy
sequences of token 0 of at most ``max_len`` rows each, after the real ones,
then empty sequences up to ``seqs``: every row is in some sequence, so
attention computes the padding rows too (no uninitialised rows flow through
the layers) but never mixes them with a real sequence, and the pooler, which
plans only the real sequences, never reads them.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, replace

import numpy as np
import torch

from poolgate.workers.batch.packing import PackedBatch, _group


def token_buckets(budget: int, *, smallest: int = 16, step: float = 1.25, align: int = 16) -> tuple[int, ...]:
    """Bucket sizes up to ``budget``: ``smallest``, then each ``step`` times the last, rounded up to ``align``
    rows, and ``budget`` itself last (about 35 for a budget of 32768: a batch runs at most 25 % padded)."""
    if budget < 1 or smallest < 1 or step <= 1:
        raise ValueError(f"budget={budget}, smallest={smallest}, step={step}")
    out, b = [], smallest
    while b < budget:
        out.append(b)
        b = max(b + align, math.ceil(b * step / align) * align)
    return (*out, budget)


def bucket_of(n_tokens: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds ``n_tokens``; None past the last."""
    i = bisect_left(buckets, n_tokens)
    return buckets[i] if i < len(buckets) else None


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class GraphShape:
    """What one captured graph runs: token rows, sequences (real, dummy and empty), the longest sequence,
    and whether the batch carries token type ids (a second input tensor)."""

    rows: int
    seqs: int
    max_len: int
    types: bool = False


def graph_shape(batch: PackedBatch, rows: int, longest: int) -> GraphShape:
    """The graph shape ``batch`` runs as in a bucket of ``rows`` for a model whose inputs are at most
    ``longest`` tokens (``max_len`` never exceeds it, so the dummy rows' positions stay in range)."""
    if rows < batch.n_tokens:
        raise ValueError(f"a bucket of {rows} rows for {batch.n_tokens} tokens")
    max_len = max(batch.max_len, min(_pow2(max(batch.max_len, 16)), longest, rows))
    dummies = math.ceil((rows - batch.n_tokens) / max_len)
    return GraphShape(rows, _pow2(len(batch.lengths) + dummies), max_len, batch.token_type_ids is not None)


def graph_batch(batch: PackedBatch, shape: GraphShape) -> PackedBatch:
    """``batch`` padded to ``shape``: dummy sequences fill the rows, empty ones the sequences (module doc).
    ``batch`` must not carry plans that index rows of a full batch (prefix plans, adapters)."""
    if batch.prefix is not None or batch.adapter_rows is not None:
        raise ValueError("a batch with a prefix plan or adapter rows runs eagerly, not as a graph")
    n, extra = batch.n_tokens, shape.rows - batch.n_tokens
    full, rest = divmod(extra, shape.max_len)
    dummy = [shape.max_len] * full + ([rest] if rest else [])
    if len(batch.lengths) + len(dummy) > shape.seqs or batch.max_len > shape.max_len or extra < 0:
        raise ValueError(f"a batch of {n} tokens in {len(batch.lengths)} sequences does not fit {shape}")
    lengths = batch.lengths + dummy + [0] * (shape.seqs - len(batch.lengths) - len(dummy))
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    starts = np.repeat(cu[len(batch.lengths):-1], lengths[len(batch.lengths):])
    positions = np.arange(n, shape.rows, dtype=np.int64) - starts
    seg = np.repeat(np.arange(len(batch.lengths), len(lengths), dtype=np.int64), lengths[len(batch.lengths):])

    def grow(t: torch.Tensor, tail: np.ndarray | None = None) -> torch.Tensor:
        return torch.cat([t, t.new_zeros(extra) if tail is None else torch.from_numpy(tail).to(t.dtype)])

    groups = batch.groups
    if groups is not None and dummy:  # the dummies attend in a group of their own (grouped SDPA)
        members = list(range(len(batch.lengths), len(batch.lengths) + len(dummy)))
        groups = [*groups, _group(members, lengths, cu)]
    return replace(batch, input_ids=grow(batch.input_ids), positions=grow(batch.positions, positions),
                   cu_seqlens=torch.from_numpy(cu.astype(np.int32)), seg_ids=grow(batch.seg_ids, seg),
                   lengths=lengths, max_len=shape.max_len, groups=groups,
                   token_type_ids=None if batch.token_type_ids is None else grow(batch.token_type_ids))
