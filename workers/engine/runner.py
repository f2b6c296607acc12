"""The pooling runner: ``prepare`` packs and uploads a batch, ``execute`` runs forward + pooler.

``prepare`` is all host work (packing into one padding-free batch, the
attention's group plan, the poolers' run plan with its row indexes, pinned
buffers and the copy to the device) and runs in the engine's prepare thread
while the previous batch executes; ``execute`` plans nothing and reads
nothing back until the results. ``execute`` is the forward, then each run of
sequences with equal params (and so one task) through its task's pooler
(``workers.pooling.dispatch``: pooled in the model's dtype, cast to fp32 after),
and one copy of the results back to the host; for detailed traces it also
reports how long the forward and the pooling took.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from poolgate.shared.rows import Rows
from poolgate.workers.backends.base import Backend
from poolgate.workers.engine.packing import PackedBatch, pack
from poolgate.workers.pooling.dispatch import DispatchPooler, RunPlan
from poolgate.workers.engine.runner_api import RunOutput, Step
from poolgate.workers.engine.sequence import Sequence, param_runs


@dataclass
class PreparedBatch:
    """A packed batch on the device, its planned runs of equal params, and the upload's ready marker."""

    packed: PackedBatch
    runs: list[RunPlan]
    ready: Any = None


class PoolingRunner:
    """One model on one backend in one dtype, built whole (see ``workers.load.build``)."""

    def __init__(self, *, model: nn.Module, backend: Backend, dtype: torch.dtype, pooler: DispatchPooler,
                 grouped: bool = False):
        self.model, self.backend, self.dtype, self.pooler = model, backend, dtype, pooler
        # the SDPA group plan is host work: made here in prepare when the backend's attention or the model
        # (a relative bias, soft-capping: PackedModel.needs_groups) reads it
        self.group_attention = grouped or backend.uses_groups(dtype)

    def prepare(self, seqs: list[Sequence]) -> PreparedBatch:
        packed = pack([s.token_ids for s in seqs], token_types=[s.token_type_ids for s in seqs],
                      group_attention=self.group_attention)
        runs = self.pooler.plan(packed, param_runs(seqs))
        packed, ready = self.backend.upload(packed)
        return PreparedBatch(packed, runs, ready)

    @torch.inference_mode()
    def execute(self, batch: PreparedBatch, steps: list[Step] | None = None) -> list[RunOutput]:
        start = time.perf_counter()
        self.backend.wait_upload(batch.ready, batch.packed)
        hidden = self.model(batch.packed)  # (n_tokens, hidden) in the model's dtype; poolers cast what they pool
        if steps is not None:
            self.backend.synchronize()
            forwarded = time.perf_counter()
            steps.append(("forward", start, forwarded))
        pooled = self.pooler(hidden, batch.packed, batch.runs)  # per run: (rows, dim) [+ token offsets]
        host = self.backend.to_host([p.values for p in pooled])
        if steps is not None:
            steps.append(("pool", forwarded, time.perf_counter()))
        return [RunOutput(r.start, r.stop, Rows(h, p.offsets)) for r, h, p in zip(batch.runs, host, pooled)]

    def run(self, seqs: list[Sequence]) -> list[RunOutput]:
        """prepare + execute in one go (start-up probes, warm-up, tests)."""
        return self.execute(self.prepare(seqs))
