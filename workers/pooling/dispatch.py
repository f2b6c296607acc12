"""Poolers: a pooling method × a head per task, and the dispatch pooler that runs a batch's runs.

A ``Pooler`` is what one task does to the hidden states: a method (CLS, MEAN,
LAST per sequence; ALL per token) and a head (embed or classify). The
``DispatchPooler`` maps each task a model serves to its pooler, is checked
when built (token tasks need a token method, sequence tasks a sequence one),
and gives ``ModelInfo.tasks`` in vLLM's order (the first is the active task).
A batch may mix tasks: each run of sequences with equal params goes through
its task's pooler; sequence methods are computed once per batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from poolgate.shared.params import PoolingParams
from poolgate.shared.tasks import ACTIVE_TASK_ORDER, POOLING_TASKS
from poolgate.workers.engine.packing import PackedBatch
from poolgate.workers.pooling.methods import POOLING_TYPES, TOKEN_POOLING_TYPES
from poolgate.workers.pooling.rows import RowSelector, all_rows

TOKEN_TASKS = frozenset({"token_embed", "token_classify"})


@dataclass(frozen=True)
class Pooler:
    """One task's pooling: ``method`` (a POOLING_TYPES name) then ``head`` (params-aware).

    ``pool`` replaces the named method by a module of the model's own (SPLADE's MLM-head max)."""

    method: str
    head: nn.Module
    pool: nn.Module | None = None
    rows: RowSelector = all_rows  # token methods: which token rows to keep


    @property
    def per_token(self) -> bool:
        return self.method in TOKEN_POOLING_TYPES


@dataclass(frozen=True)
class Pooled:
    """One run's outputs: ``values`` (rows, dim) on the device; ``offsets`` (k + 1,) for token tasks."""

    values: torch.Tensor
    offsets: np.ndarray | None = None


class DispatchPooler:
    """task → Pooler, checked when built."""

    def __init__(self, poolers: dict[str, Pooler], *, active: str | None = None,
                 labels: tuple[str, ...] | None = None, out_dim: int | None = None):
        for task, pooler in poolers.items():
            if task not in POOLING_TASKS:
                raise ValueError(f"unknown task {task!r}")
            if pooler.pool is None and pooler.method not in POOLING_TYPES:
                raise ValueError(f"unknown pooling type {pooler.method!r} for task {task!r}")
            if pooler.per_token != (task in TOKEN_TASKS):
                raise ValueError(f"task {task!r} cannot pool with {pooler.method}")
        if not poolers:
            raise ValueError("a model must serve at least one task")
        if active is not None and active not in poolers:
            raise ValueError(f"Unsupported task: {active!r} Supported tasks: {tuple(poolers)}")
        self.poolers, self.active = poolers, active
        self.labels, self.out_dim = labels, out_dim  # class names; output width when it is not the hidden size

    @property
    def tasks(self) -> tuple[str, ...]:
        """The served tasks, the active one first (the pooler config's task, else vLLM's order)."""
        ordered = tuple(t for t in ACTIVE_TASK_ORDER if t in self.poolers)
        return ordered if self.active is None else (self.active, *(t for t in ordered if t != self.active))

    def __call__(self, hidden: torch.Tensor, batch: PackedBatch,
                 runs: list[tuple[int, int, PoolingParams]]) -> list[Pooled]:
        """hidden: (n_tokens, hidden) fp32 → one ``Pooled`` per run, in order."""
        cache: dict[str, torch.Tensor] = {}
        out = []
        for a, b, params in runs:
            pooler = self.poolers[params.task]
            if pooler.per_token:
                lo = sum(batch.lengths[:a])
                tokens = hidden[lo:lo + sum(batch.lengths[a:b])]  # the run's rows, (tokens, hidden)
                index, counts = pooler.rows(batch, a, b)
                if index is not None:
                    tokens = tokens.index_select(0, index)
                offsets = np.cumsum([0, *counts], dtype=np.int64)
                out.append(Pooled(pooler.head(tokens, params), offsets))  # (kept tokens, dim)
                continue
            if pooler.method not in cache:
                method = pooler.pool or POOLING_TYPES[pooler.method]
                cache[pooler.method] = method(hidden, batch)  # (batch, hidden) or the method's own width
            out.append(Pooled(pooler.head(cache[pooler.method][a:b], params)))  # (b - a, dim)
        return out
