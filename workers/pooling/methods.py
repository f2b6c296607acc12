"""Pooling methods over packed hidden states: CLS, MEAN, LAST per sequence; ALL per token.

A sequence method turns ``(n_tokens, hidden)`` into ``(n_seqs, hidden)``; a
token method keeps rows per token, which the pooler returns with offsets.
Hidden states come in the model's dtype: CLS and LAST only pick rows (the
pooler casts them), MEAN sums in fp32.
"""
from __future__ import annotations

from typing import Callable

import torch

from poolgate.workers.batch.packing import PackedBatch

PoolingMethod = Callable[[torch.Tensor, PackedBatch], torch.Tensor]


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


POOLING_TYPES: dict[str, PoolingMethod] = {
    "CLS": cls_pool,
    "MEAN": mean_pool,
    "LAST": last_pool,
    "ALL": all_pool,
    "STEP": all_pool,  # the rows are then narrowed to the step tag's positions (pooling.rows.step_rows)
}
TOKEN_POOLING_TYPES = frozenset({"ALL", "STEP"})  # the methods that keep rows per token
