"""Which token rows a token-level pooler keeps: all of them, a STEP tag's positions, or all but the ends.

A selector runs on the host, in the runner's ``prepare``: it gets one run's
token ids (a numpy array, the run's own rows in packed order) and the length
of each of its sequences, and returns the rows to keep (an index into the
run's rows, or None for all) and how many each sequence keeps, so the run's
output offsets are exact without reading anything back from the device.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

RowSelector = Callable[[np.ndarray, list[int]], tuple[np.ndarray | None, list[int]]]


def all_rows(ids: np.ndarray, lengths: list[int]) -> tuple[None, list[int]]:
    return None, list(lengths)


def per_sequence_counts(keep: np.ndarray, lengths: list[int]) -> list[int]:
    """How many True entries of ``keep`` (the run's tokens) fall in each sequence."""
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    running = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])
    return (running[bounds[1:]] - running[bounds[:-1]]).tolist()


def step_rows(step_tag_id: int | None) -> RowSelector:
    """STEP pooling: the positions whose input token is ``step_tag_id`` (every position when None)."""
    if step_tag_id is None:
        return all_rows

    def select(ids: np.ndarray, lengths: list[int]) -> tuple[np.ndarray, list[int]]:
        keep = ids == step_tag_id  # (run tokens,)
        return np.flatnonzero(keep), per_sequence_counts(keep, lengths)

    return select


def drop_ends(first: int = 1, last: int = 0) -> RowSelector:
    """Every position but the first ``first`` and last ``last`` of each sequence (BGE-M3 drops BOS/EOS)."""

    def select(ids: np.ndarray, lengths: list[int]) -> tuple[np.ndarray, list[int]]:
        n = np.repeat(np.asarray(lengths, dtype=np.int64), lengths)  # each token's sequence length
        starts = np.repeat(np.cumsum([0, *lengths[:-1]], dtype=np.int64), lengths)
        position = np.arange(n.shape[0], dtype=np.int64) - starts
        keep = (position >= first) & (position < n - last)
        return np.flatnonzero(keep), per_sequence_counts(keep, lengths)

    return select
