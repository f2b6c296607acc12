"""Which token rows a token-level pooler keeps: all of them, a STEP tag's positions, or all but the ends.

A selector gets the packed batch and a run's sequences ``a..b`` and returns
the rows to keep (an index into the run's own rows, or None for all) and how
many each sequence keeps, so the run's output offsets are exact.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from poolgate.workers.engine.packing import PackedBatch

RowSelector = Callable[[PackedBatch, int, int], tuple[torch.Tensor | None, list[int]]]


def all_rows(batch: PackedBatch, a: int, b: int) -> tuple[None, list[int]]:
    return None, list(batch.lengths[a:b])


def step_rows(step_tag_id: int | None) -> RowSelector:
    """STEP pooling: the positions whose input token is ``step_tag_id`` (every position when None)."""
    if step_tag_id is None:
        return all_rows

    def select(batch: PackedBatch, a: int, b: int) -> tuple[torch.Tensor, list[int]]:
        lo = sum(batch.lengths[:a])
        ids = batch.input_ids[lo:lo + sum(batch.lengths[a:b])]
        keep = (ids == step_tag_id).cpu().numpy()  # a host copy: the counts shape the offsets
        bounds = np.cumsum([0, *batch.lengths[a:b]])
        counts = [int(keep[s:e].sum()) for s, e in zip(bounds[:-1], bounds[1:])]
        return torch.from_numpy(np.flatnonzero(keep)).to(ids.device), counts

    return select


def drop_ends(first: int = 1, last: int = 0) -> RowSelector:
    """Every position but the first ``first`` and last ``last`` of each sequence (BGE-M3 drops BOS/EOS)."""

    def select(batch: PackedBatch, a: int, b: int) -> tuple[torch.Tensor, list[int]]:
        lengths = batch.lengths[a:b]
        starts = np.cumsum([0, *lengths[:-1]])
        index = np.concatenate([np.arange(s + first, s + max(n - last, first)) for s, n in zip(starts, lengths)])
        counts = [max(n - first - last, 0) for n in lengths]
        return torch.from_numpy(index.astype(np.int64)).to(batch.input_ids.device), counts

    return select
