"""The pooling runner: ``prepare`` packs and uploads a batch, ``execute`` runs forward + pooler.

``prepare`` is all host work (packing into one padding-free batch, the
attention's group plan, the poolers' run plan with its row indexes, pinned
buffers and the copy to the device) and runs in the engine's prepare thread
while the previous batch executes; ``execute`` plans nothing and reads
nothing back until the results. ``execute`` is the forward, then each run of
sequences with equal params (and so one task) through its task's pooler
(``workers.pooling.dispatch``: pooled in the model's dtype, cast to fp32 after),
and one copy of the results back to the host; for detailed traces it also
reports how long the forward and the pooling took. Where the backend runs
several CPU core threads (``workers.engine.core_threads``), a batch of several sequences is
prepared as parts, one per core thread, executed at once, and their outputs joined in
order. A packed model runs each batch (or part) as the backend's token bucket
(``Backend.token_bucket``; the CPU's rounds up so oneDNN reuses its GEMM
primitives): ``packing.padded_rows`` adds rows in no sequence, and their hidden
states are dropped before pooling.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from poolgate.shared.wire.rows import Rows
from poolgate.workers.backends.base import Backend
from poolgate.workers.engine.core_threads import CoreThreads, cut
from poolgate.workers.engine.chunked_prefill import ChunkedPrefill
from poolgate.workers.engine.cuda_graphs import CudaGraphs
from poolgate.workers.engine.prefix_cache import PrefixCache
from poolgate.workers.engine.graph_batch import GraphShape, graph_batch
from poolgate.workers.batch.packing import PackedBatch, pack, padded_rows
from poolgate.workers.pooling.dispatch import DispatchPooler, RunPlan
from poolgate.workers.engine.runner_api import RunOutput, Step
from poolgate.workers.engine.sequence import Sequence, param_runs
from poolgate.workers.models.task_adapters import active


@dataclass
class PreparedBatch:
    """A packed batch on the device, its planned runs of equal params, and the upload's ready marker."""

    packed: PackedBatch
    runs: list[RunPlan]
    ready: Any = None
    model_input: PackedBatch | None = None  # ``packed`` with the backend's token-bucket rows; None = ``packed``
    graph: GraphShape | None = None  # the CUDA graph's shape ``model_input`` is padded to; None = eager


@dataclass
class LanedBatch:
    """A batch prepared as parts for the core threads: (index of the part's first sequence in the batch, the part)."""

    parts: list[tuple[int, PreparedBatch]]


MAX_PART_SHARE = 0.7  # with core threads, a batch runs whole when its biggest part would hold more of its tokens


class PoolingRunner:
    """One model on one backend in one dtype, built whole (see ``workers.load.build``)."""

    def __init__(self, *, model: nn.Module, backend: Backend, dtype: torch.dtype, pooler: DispatchPooler,
                 grouped: bool = False, prefix_cache: PrefixCache | None = None):
        self.model, self.backend, self.dtype, self.pooler = model, backend, dtype, pooler
        self.prefix_cache = prefix_cache  # causal LAST-pooled sequences skip cached prefixes (engine.prefix_cache)
        self.chunked_prefill: ChunkedPrefill | None = None  # long LAST-pooled inputs in chunks (engine.chunked_prefill)
        # the SDPA group plan is host work: made here in prepare when the backend's attention or the model
        # (a relative bias, soft-capping: PackedModel.needs_groups) reads it
        self.group_attention = grouped or backend.uses_groups(dtype)
        self.core_threads = CoreThreads(backend.core_threads()) if backend.core_threads() > 1 else None
        self.adapters = getattr(model, "task_adapters", None)  # per-request task LoRAs (models.task_adapters, run_loras)
        # a packed model runs its batches as the backend's token buckets (transformers' own forward: exact)
        self.bucketed = bool(getattr(model, "packed_rows", True))
        self.graphs: CudaGraphs | None = None  # --cuda-graphs (engine.cuda_graphs): set by the loader

    def prepare(self, seqs: list[Sequence]) -> PreparedBatch | LanedBatch:
        """One batch, or with core threads a part per core thread; a batch that cannot be cut into parts of about equal
        tokens (one sequence, one long one among short ones) runs whole, on a team of every core thread's core."""
        if self.core_threads is None or len(seqs) < 2:
            return self._prepare_part(seqs)
        tokens = [s.num_tokens for s in seqs]
        parts = cut(tokens, self.core_threads.n)
        if len(parts) < 2 or max(sum(tokens[a:b]) for a, b in parts) > MAX_PART_SHARE * sum(tokens):
            return self._prepare_part(seqs)
        return LanedBatch([(a, self._prepare_part(seqs[a:b])) for a, b in parts])

    def _prepare_part(self, seqs: list[Sequence]) -> PreparedBatch:
        chunked = any(s.prefill is not None for s in seqs)  # such a batch neither reads nor fills the prefix cache
        skips = self.prefix_cache.plan(seqs) if self.prefix_cache is not None and not chunked else None
        if chunked:  # a chunk's rows run at their true positions after its kept K/V (engine.chunked_prefill)
            assert self.chunked_prefill is not None
            starts, plan = self.chunked_prefill.plan(seqs)
            packed = pack([s.token_ids for s in seqs], group_attention=self.group_attention,
                          token_types=[s.token_type_ids for s in seqs])
            packed.positions += torch.repeat_interleave(torch.tensor(starts), torch.tensor(packed.lengths))
            packed.prefix = plan
        elif skips is not None and skips.plan is not None:  # only the rows after each skipped prefix run
            packed = pack([s.token_ids[k:] for s, k in zip(seqs, skips.skips)], group_attention=self.group_attention,
                          token_types=[None if s.token_type_ids is None else s.token_type_ids[k:]
                                       for s, k in zip(seqs, skips.skips)])
            packed.positions += torch.repeat_interleave(torch.tensor(skips.skips), torch.tensor(packed.lengths))
            packed.prefix = skips.plan
        else:
            packed = pack([s.token_ids for s in seqs], token_types=[s.token_type_ids for s in seqs],
                          attend=[s.attend for s in seqs], group_attention=self.group_attention)
        if any(s.media is not None for s in seqs):  # a media model reads them beside the ids (workers.models.media)
            if not getattr(self.model, "takes_media", False):
                raise ValueError("a call holds images or audio, but this model reads text only")
            packed.media = [s.media for s in seqs]
        runs = self.pooler.plan(packed, param_runs(seqs))
        if self.adapters is not None:  # per task, the rows of its sequences' tokens
            packed.adapter_rows = self.adapters.plan_params([s.params for s in seqs], packed.cu_seqlens)
        elif any(s.params.lora is not None for s in seqs):  # never the base model's answer for an adapter's call
            raise ValueError("a call names a LoRA adapter, but this model serves none (--max-loras 0)")
        same_rows = packed.prefix is None or packed.prefix.exact_rows  # skipped prefixes: the rows are exact
        graph = self.graphs.shape(packed) if self.graphs is not None and self.bucketed else None
        rows = self.backend.token_bucket(packed.n_tokens) if self.bucketed and same_rows else packed.n_tokens
        host_input = graph_batch(packed, graph) if graph is not None else padded_rows(packed, rows)
        model_input, ready = self.backend.upload(host_input)
        if host_input is packed:
            return PreparedBatch(model_input, runs, ready)
        n = packed.n_tokens
        real = replace(model_input, input_ids=model_input.input_ids[:n], positions=model_input.positions[:n],
                       seg_ids=model_input.seg_ids[:n], token_type_ids=None if model_input.token_type_ids is None
                       else model_input.token_type_ids[:n])
        if graph is not None:  # the real sequences' boundaries, as the pooler plans them
            real = replace(real, cu_seqlens=model_input.cu_seqlens[:len(packed.lengths) + 1], lengths=packed.lengths,
                           max_len=packed.max_len, groups=None if packed.groups is None else
                           model_input.groups[:len(packed.groups)])
        return PreparedBatch(real, runs, ready, model_input, graph)

    def execute(self, batch: PreparedBatch | LanedBatch, steps: list[Step] | None = None) -> list[RunOutput]:
        if isinstance(batch, PreparedBatch):
            if self.core_threads is not None:  # a whole batch on a CPU with core threads: one team over their cores
                torch.set_num_threads(self.core_threads.n)
            return self._execute_part(batch, steps)
        timings: list[list[Step] | None] = [[] if steps is not None else None for _ in batch.parts]
        done = self.core_threads.map(lambda i: self._execute_part(batch.parts[i][1], timings[i]), range(len(batch.parts)))
        if steps is not None:  # the parts ran at once: forward from the first start to the last forward's end
            forward = [t[0] for t in timings]
            pool_end = max(t[1][2] for t in timings)
            steps += [("forward", min(f[1] for f in forward), max(f[2] for f in forward)),
                      ("pool", max(f[2] for f in forward), pool_end)]
        return _joined(batch, done)

    @torch.inference_mode()
    def _execute_part(self, batch: PreparedBatch, steps: list[Step] | None = None) -> list[RunOutput]:
        start = time.perf_counter()
        self.backend.wait_upload(batch.ready, batch.packed)
        with active(batch.packed.adapter_rows) if self.adapters is not None else nullcontext():
            model_input = batch.packed if batch.model_input is None else batch.model_input
            if batch.graph is not None and self.graphs is not None:
                hidden = self.graphs.run(batch.graph, model_input)[:batch.packed.n_tokens]
            else:
                hidden = self.model(model_input)[:batch.packed.n_tokens]  # (n_tokens, hidden); bucket rows dropped
        if model_input.prefix is not None and model_input.prefix.chunks:
            ChunkedPrefill.keep(model_input.prefix)
        elif model_input.prefix is not None and self.prefix_cache is not None:
            self.prefix_cache.store(model_input.prefix)
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


def _joined(batch: LanedBatch, done: list[list[RunOutput]]) -> list[RunOutput]:
    """The parts' outputs in batch order, a run cut between two parts made one again (as if run whole)."""
    joined: list[tuple[RunOutput, object]] = []
    for (a, part), outs in zip(batch.parts, done):
        for plan, o in zip(part.runs, outs):
            o = RunOutput(o.start + a, o.stop + a, o.rows)
            if joined and joined[-1][1] == plan.params and joined[-1][0].stop == o.start:
                prev = joined[-1][0]
                o = RunOutput(prev.start, o.stop, Rows.concat([prev.rows, o.rows]))
                joined.pop()
            joined.append((o, plan.params))
    return [o for o, _ in joined]
