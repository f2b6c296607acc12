"""The torch references of the pooling ops: segment pooling over packed hidden states, and L2 normalize + cut.

These are the ops bundle's defaults (``workers.kernels.ops``) and what every
faster pooling kernel is tested against. A sequence method turns
``(n_tokens, hidden)`` into ``(n_seqs, hidden)``: CLS and LAST pick rows in the
model's dtype (the pooler casts them), MEAN sums in fp32. ``kept_mean`` and
``kept_rows`` are the two uses of a pooler's row plan (``pooling.rows``): the
mean over each sequence's kept rows, and the kept rows themselves, in fp32.
The kept rows of a run come in packed order (a selector's ``np.flatnonzero``),
so each sequence's kept rows are contiguous in the plan.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
import torch.nn.functional as F

from poolgate.workers.batch.packing import PackedBatch

PoolingMethod = Callable[[torch.Tensor, PackedBatch], torch.Tensor]
KeptMean = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", int], torch.Tensor]
KeptRows = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]
L2Cut = Callable[[torch.Tensor, "int | None", bool], torch.Tensor]
EPS = 1e-12  # F.normalize's


def cls_pool(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """(n_tokens, hidden) → (batch, hidden): each sequence's first token."""
    return hidden.index_select(0, batch.cu_seqlens[:-1].long())


def last_pool(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """(n_tokens, hidden) → (batch, hidden): each sequence's last token."""
    return hidden.index_select(0, batch.cu_seqlens[1:].long() - 1)


def mean_pool(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """(n_tokens, hidden) → (batch, hidden) fp32: the mean over each sequence's tokens."""
    n_seqs = batch.cu_seqlens.shape[0] - 1
    sums = hidden.new_zeros(n_seqs, hidden.shape[1], dtype=torch.float32).index_add_(0, batch.seg_ids, hidden.float())
    counts = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).float()  # (batch,)
    return sums / counts[:, None]


def all_pool(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """(n_tokens, hidden) → (n_tokens, hidden): every token, in packed order (token-level tasks)."""
    return hidden


def kept_mean(tokens: torch.Tensor, seq: torch.Tensor, index: torch.Tensor | None, n: int) -> torch.Tensor:
    """A run's (tokens, hidden) rows, each row's sequence in the run ``seq`` (tokens,) int64 and the kept rows
    ``index`` (kept,) (None: all) → (n, hidden) fp32: each sequence's mean over its kept rows (zeros where none)."""
    if index is not None:
        tokens, seq = tokens.index_select(0, index), seq.index_select(0, index)  # (kept, hidden), (kept,)
    sums = tokens.new_zeros(n, tokens.shape[1], dtype=torch.float32).index_add_(0, seq, tokens.float())
    ones = tokens.new_ones(seq.shape[0], dtype=torch.float32)  # (kept,)
    counts = tokens.new_zeros(n, dtype=torch.float32).index_add_(0, seq, ones)  # (n,)
    return sums / counts.clamp(min=1.0)[:, None]


def kept_rows(tokens: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """A run's (tokens, hidden) rows → its kept rows ``index`` (kept,) (None: all), (kept, hidden) fp32."""
    return (tokens if index is None else tokens.index_select(0, index)).float()


def l2_cut(x: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """(k, dim) → (k, dimensions or dim): the first ``dimensions`` columns (matryoshka), then L2-normalized."""
    if dimensions is not None:
        x = x[:, :dimensions]
    return F.normalize(x, p=2, dim=-1, eps=EPS) if normalize else x


POOLING: Mapping[str, PoolingMethod] = MappingProxyType({
    "CLS": cls_pool,
    "MEAN": mean_pool,
    "LAST": last_pool,
    "ALL": all_pool,
    "STEP": all_pool,  # the rows are then narrowed to the step tag's positions (pooling.rows.step_rows)
})
