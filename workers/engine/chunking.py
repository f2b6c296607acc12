"""Chunked processing of long embed inputs (vLLM's ``enable_chunked_processing``): split, then fold back.

With ``--pooler-config '{"enable_chunked_processing": true}'`` an embed input
longer than ``max_model_len`` (up to ``max_embed_len``, checked by the input
stage) is cut into chunks of ``max_model_len`` tokens, in order, the last one
shorter. Each chunk is its own ``Sequence``: chunks of one input may run in
different batches, and the call is done when its last chunk is pooled. The
call's rows are then folded back to one row per input, in input order: the
token-weighted mean of its chunk embeddings, re-normalized (vLLM's rule) when
``use_activation`` is on, there is more than one chunk and every chunk came
out unit norm. An input that fits in one chunk keeps its row exactly. The
weighted mean of per-chunk means is the mean over all tokens only for MEAN
pooling, so the worker refuses chunking for any other (``workers.load.build``).
How a task's chunk rows fold back is ``FOLDS`` (by task; the tasks that run in
chunks are ``shared.domain.limits.CHUNKED_TASKS``). A long document scored against a
query folds its windows' *scores* instead (max or mean, ``shared.domain.score_plan``),
since a bi-encoder's window vectors must be scored before they can be folded.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows

UNIT_NORM_TOL = 1e-3  # |norm - 1| under this counts as unit norm (rows are pooled and normalized in fp32)


@dataclass(frozen=True)
class Chunks:
    """How a call's inputs were split: input ``i`` became ``counts[i]`` consecutive sequences."""

    counts: np.ndarray  # (n_inputs,) int64, chunks per input
    weights: np.ndarray  # (n_chunks,) float64, tokens per chunk
    renormalize: bool  # use_activation is not off
    task: str = "embed"  # whose fold (FOLDS) joins the chunks back


def split(token_lists: list[list[int]], size: int, params: PoolingParams) -> tuple[list[list[int]], Chunks | None]:
    """The sequences to run for ``token_lists``: each cut into ``size``-token chunks; None when none was cut."""
    if all(len(ids) <= size for ids in token_lists):
        return token_lists, None
    pieces = [[ids[i:i + size] for i in range(0, len(ids), size)] for ids in token_lists]
    seqs = [chunk for chunks in pieces for chunk in chunks]
    counts = np.array([len(chunks) for chunks in pieces], dtype=np.int64)
    weights = np.array([len(chunk) for chunk in seqs], dtype=np.float64)
    return seqs, Chunks(counts, weights, renormalize=params.use_activation is not False, task=params.task)


def fold(rows: Rows, chunks: Chunks) -> Rows:
    """One row per input from one row per chunk, by the task's fold (vectorized over the whole call)."""
    if rows.offsets is not None or len(rows) != len(chunks.weights):
        raise ValueError(f"cannot fold {len(rows)} rows into {len(chunks.counts)} chunked inputs")
    return FOLDS[chunks.task](rows, chunks)


def mean_fold(rows: Rows, chunks: Chunks) -> Rows:
    """vLLM's embed fold: the token-weighted mean of an input's chunk rows, re-normalized when they were."""
    values = rows.values  # (n_chunks, dim)
    starts = np.cumsum(chunks.counts) - chunks.counts  # (n_inputs,) first chunk of each input
    weighted = values.astype(np.float64) * chunks.weights[:, None]  # (n_chunks, dim)
    means = np.add.reduceat(weighted, starts, axis=0) / np.add.reduceat(chunks.weights, starts)[:, None]
    many = chunks.counts > 1  # (n_inputs,)
    if chunks.renormalize:
        unit = np.abs(np.linalg.norm(values, axis=1) - 1.0) < UNIT_NORM_TOL  # (n_chunks,)
        renorm = many & np.logical_and.reduceat(unit, starts)
        norms = np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)  # (n_inputs, 1)
        means = np.where(renorm[:, None], means / norms, means)
    return Rows(np.where(many[:, None], means, values[starts]).astype(values.dtype))  # (n_inputs, dim)


# How each chunked task's chunk rows become one row per input.
FOLDS: dict[str, Callable[[Rows, Chunks], Rows]] = {
    "embed": mean_fold,
}
