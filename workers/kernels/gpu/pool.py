"""Segment pooling over a packed batch in Triton: row picks (CLS, LAST, the kept rows) and the segment mean.

Two kernels (``pool_jit``) serve every pooling op of the bundle
(``workers.kernels.pooling`` holds the references): ``pick_rows`` copies the
rows named by an index into a contiguous output, casting on the way (CLS and
LAST keep the model's dtype, a token method's kept rows come out fp32);
``segment_mean`` sums each segment's rows in fp32 and divides by its count, a
segment being either a range of packed rows (MEAN: ``cu_seqlens``) or a range
of a kept-row index (MEAN with a row selector: zeros where a sequence keeps
nothing). Each program owns one output row and one block of columns, so no
two programs write the same place and nothing is atomic. Hidden states on the
CPU (not under the interpreter) go to the references. ``triton_pooling(ops)``
puts these into an ops bundle, with the L2 normalize + cut (``gpu.normalize``).
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import torch

from poolgate.workers.batch.packing import PackedBatch
from poolgate.workers.kernels import pooling as reference
from poolgate.workers.kernels.gpu.normalize import l2_cut
from poolgate.workers.kernels.gpu.rows import runs_here
from poolgate.workers.kernels.ops import Ops

BLOCK_COLS = 256  # columns per program
BLOCK_ROWS = 16  # rows summed per step of the segment mean


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x with unit column stride (a kernel reads rows as ``row * stride + column``)."""
    return x if x.stride(1) == 1 else x.contiguous()


def pick_rows(src: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(n, cols) rows ``index`` (k,) → (k, cols) in ``dtype``."""
    from poolgate.workers.kernels.gpu import pool_jit

    src = _rows(src)
    out = src.new_empty(index.shape[0], src.shape[1], dtype=dtype)
    if out.numel():
        grid = (index.shape[0], -(-src.shape[1] // BLOCK_COLS))
        pool_jit.pick_rows[grid](src, index, out, src.shape[1], src.stride(0), out.stride(0), BLOCK=BLOCK_COLS)
    return out


def segment_mean(src: torch.Tensor, bounds: torch.Tensor, rows: torch.Tensor | None = None,
                 min_count: float = 0.0) -> torch.Tensor:
    """(n, cols) and (segments + 1,) bounds into the rows (or into ``rows``, an index) → (segments, cols) fp32."""
    from poolgate.workers.kernels.gpu import pool_jit

    src = _rows(src)
    out = src.new_empty(bounds.shape[0] - 1, src.shape[1], dtype=torch.float32)
    if out.numel():
        grid = (out.shape[0], -(-src.shape[1] // BLOCK_COLS))
        pool_jit.segment_mean[grid](src, bounds if rows is None else rows, bounds, out, src.shape[1], src.stride(0),
                                    out.stride(0), float(min_count), BY_INDEX=rows is not None, BLOCK_R=BLOCK_ROWS,
                                    BLOCK=BLOCK_COLS)
    return out


def cls_pool(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """(n_tokens, hidden) → (batch, hidden) in hidden's dtype: each sequence's first token."""
    if not runs_here(hidden):
        return reference.cls_pool(hidden, batch)
    return pick_rows(hidden, batch.cu_seqlens[:-1], hidden.dtype)


def last_pool(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """(n_tokens, hidden) → (batch, hidden) in hidden's dtype: each sequence's last token."""
    if not runs_here(hidden):
        return reference.last_pool(hidden, batch)
    return pick_rows(hidden, batch.cu_seqlens[1:] - 1, hidden.dtype)


def mean_pool(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """(n_tokens, hidden) → (batch, hidden) fp32: the mean over each sequence's tokens."""
    if not runs_here(hidden):
        return reference.mean_pool(hidden, batch)
    return segment_mean(hidden, batch.cu_seqlens)


def all_pool(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """(n_tokens, hidden) → (n_tokens, hidden): every token (the pooler narrows and casts: ``kept_rows``)."""
    return hidden


def kept_mean(tokens: torch.Tensor, seq: torch.Tensor, index: torch.Tensor | None, n: int) -> torch.Tensor:
    """A run's (tokens, hidden) rows → (n, hidden) fp32: each sequence's mean over its kept rows ``index``
    (None: all; in packed order), zeros where it keeps none. ``seq`` (tokens,) is each row's sequence in the run."""
    if not runs_here(tokens):
        return reference.kept_mean(tokens, seq, index, n)
    kept = seq if index is None else seq.index_select(0, index)  # (kept,) ascending
    bounds = torch.searchsorted(kept, torch.arange(n + 1, device=kept.device, dtype=kept.dtype))  # (n + 1,)
    return segment_mean(tokens, bounds, index, min_count=1.0)


def kept_rows(tokens: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """A run's (tokens, hidden) rows → its kept rows ``index`` (None: all), (kept, hidden) fp32."""
    if index is None or not runs_here(tokens):
        return reference.kept_rows(tokens, index)
    return pick_rows(tokens, index, torch.float32)


POOLING = MappingProxyType({"CLS": cls_pool, "MEAN": mean_pool, "LAST": last_pool, "ALL": all_pool,
                            "STEP": all_pool})


def triton_pooling(ops: Ops) -> Ops:
    """``ops`` with the Triton pooling and L2 normalize + cut in place of the references."""
    return replace(ops, pooling=POOLING, kept_mean=kept_mean, kept_rows=kept_rows, l2_cut=l2_cut)
