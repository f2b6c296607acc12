"""Poolers: a pooling method × a head per task, and the dispatch pooler that runs a batch's runs.

A ``Pooler`` is what one task does to the hidden states: a method (CLS, MEAN,
LAST per sequence; ALL per token) and a head (embed or classify). The
``DispatchPooler`` maps each task a model serves to its pooler, is checked
when built (token tasks need a token method, sequence tasks a sequence one),
and gives ``ModelInfo.tasks`` in vLLM's order (the first is the active task).
A batch may mix tasks: each run of sequences with equal params goes through
its task's pooler; sequence methods are computed once per batch. A MEAN pooler
with a row selector (GritLM: the tokens after the instruction) averages only
the rows it keeps, per run. A multi-output
run (``PoolingParams.outputs``) is planned once per output, over the same
sequences and the same hidden states, so one forward feeds every head; the
runner reports one output per plan (``runner_api.join_outputs`` groups them).

``plan`` is the host half, run in the runner's ``prepare``: each run's token
range and, for token tasks, the rows kept and their offsets (the row index
goes to the device with the batch, ``PackedBatch.run_rows``). The call is the
device half: it pools first, in the model's dtype where the method allows,
and casts only what is pooled to fp32 for the heads. The pooling itself is
the ops bundle's the pooler was built with (``Ops.pooling``, ``kept_mean``,
``kept_rows``: the torch references, or a GPU backend's Triton kernels).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.tasks import ACTIVE_TASK_ORDER, POOLING_TASKS
from poolgate.workers.batch.packing import PackedBatch
from poolgate.workers.kernels.ops import REFERENCE, Ops
from poolgate.workers.pooling.methods import TOKEN_POOLING_TYPES
from poolgate.workers.pooling.rows import RowSelector, all_rows

TOKEN_TASKS = frozenset({"token_embed", "token_classify"})


@dataclass(frozen=True)
class Pooler:
    """One task's pooling: ``method`` (an ``Ops.pooling`` name: CLS, MEAN, ...) then ``head`` (params-aware).

    ``pool`` replaces the named method by a module of the model's own (SPLADE's MLM-head max)."""

    method: str
    head: nn.Module
    pool: nn.Module | None = None
    rows: RowSelector = all_rows  # token methods, and MEAN: which token rows to keep

    @property
    def per_token(self) -> bool:
        return self.method in TOKEN_POOLING_TYPES

    @property
    def selects_rows(self) -> bool:
        """Whether ``plan`` narrows this pooler's rows (every token method; MEAN with its own selector)."""
        return self.per_token or self.rows is not all_rows


@dataclass(frozen=True)
class RunPlan:
    """One run of sequences ``start..stop`` with equal params: its tokens ``lo..hi`` in the batch, and for
    token tasks the (k + 1,) offsets of each sequence's kept rows."""

    start: int
    stop: int
    params: PoolingParams
    lo: int
    hi: int
    offsets: np.ndarray | None = None


@dataclass(frozen=True)
class Pooled:
    """One run's outputs: ``values`` (rows, dim) on the device; ``offsets`` (k + 1,) for token tasks."""

    values: torch.Tensor
    offsets: np.ndarray | None = None


class DispatchPooler:
    """task → Pooler, checked when built."""

    def __init__(self, poolers: dict[str, Pooler], *, active: str | None = None,
                 labels: tuple[str, ...] | None = None, out_dim: int | None = None, ops: Ops = REFERENCE):
        for task, pooler in poolers.items():
            if task not in POOLING_TASKS:
                raise ValueError(f"unknown task {task!r}")
            if pooler.pool is None and pooler.method not in ops.pooling:
                raise ValueError(f"unknown pooling type {pooler.method!r} for task {task!r}")
            if pooler.per_token != (task in TOKEN_TASKS):
                raise ValueError(f"task {task!r} cannot pool with {pooler.method}")
            if pooler.selects_rows and not pooler.per_token and (pooler.method != "MEAN" or pooler.pool):
                raise ValueError(f"task {task!r}: a row selector narrows MEAN pooling only, not {pooler.method}")
        if not poolers:
            raise ValueError("a model must serve at least one task")
        if active is not None and active not in poolers:
            raise ValueError(f"Unsupported task: {active!r} Supported tasks: {tuple(poolers)}")
        self.poolers, self.active = poolers, active
        self.labels, self.out_dim = labels, out_dim  # class names; output width when it is not the hidden size
        self.ops = ops  # the backend's bundle: its pooling kernels (``Ops.pooling``, ``kept_mean``, ``kept_rows``)

    @property
    def tasks(self) -> tuple[str, ...]:
        """The served tasks, the active one first (the pooler config's task, else vLLM's order)."""
        ordered = tuple(t for t in ACTIVE_TASK_ORDER if t in self.poolers)
        return ordered if self.active is None else (self.active, *(t for t in ordered if t != self.active))

    def plan(self, batch: PackedBatch, runs: list[tuple[int, int, PoolingParams]]) -> list[RunPlan]:
        """Host work for ``runs`` of a batch still on the host; sets ``batch.run_rows`` (numpy-backed)."""
        bounds = np.zeros(len(batch.lengths) + 1, dtype=np.int64)
        np.cumsum(batch.lengths, out=bounds[1:])
        ids = batch.input_ids.numpy()
        plans, rows = [], []
        for a, b, params in runs:
            lo, hi = int(bounds[a]), int(bounds[b])
            for out in params.all_outputs():  # a multi-output run: one plan per output, same sequences
                pooler, index, offsets = self.poolers[out.task], None, None
                if pooler.selects_rows:
                    index, counts = pooler.rows(ids[lo:hi], batch.lengths[a:b])
                    offsets = np.cumsum([0, *counts], dtype=np.int64) if pooler.per_token else None
                rows.append(None if index is None else torch.from_numpy(index.astype(np.int64)))
                plans.append(RunPlan(a, b, out, lo, hi, offsets))
        batch.run_rows = rows
        return plans

    def __call__(self, hidden: torch.Tensor, batch: PackedBatch, plans: list[RunPlan]) -> list[Pooled]:
        """hidden: (n_tokens, hidden) in the model's dtype → one fp32 ``Pooled`` per planned run, in order."""
        cache: dict[str, torch.Tensor] = {}
        out = []
        for plan, index in zip(plans, batch.run_rows or [None] * len(plans)):
            pooler = self.poolers[plan.params.task]
            if pooler.per_token:
                tokens = self.ops.kept_rows(hidden[plan.lo:plan.hi], index)  # (kept tokens, hidden) fp32
                out.append(Pooled(pooler.head(tokens, plan.params), plan.offsets))  # (kept tokens, dim)
                continue
            if pooler.selects_rows:  # MEAN over the kept rows of each sequence of the run
                seq = batch.seg_ids[plan.lo:plan.hi].long() - plan.start  # (run tokens,) each row's sequence
                mean = self.ops.kept_mean(hidden[plan.lo:plan.hi], seq, index, plan.stop - plan.start)
                out.append(Pooled(pooler.head(mean, plan.params)))  # (b - a, dim)
                continue
            if pooler.method not in cache:
                method = pooler.pool or self.ops.pooling[pooler.method]
                cache[pooler.method] = method(hidden, batch)  # (batch, hidden) or the method's own width
            pooled = cache[pooler.method][plan.start:plan.stop].float()  # (b - a, hidden)
            out.append(Pooled(pooler.head(pooled, plan.params)))  # (b - a, dim)
        return out

