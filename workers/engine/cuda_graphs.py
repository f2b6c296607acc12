"""CUDA graphs for a packed model's forward, one per fixed shape (``workers.batch.graph_batch``), on a GPU.

With ``--cuda-graphs`` a CUDA worker whose attention is varlen flash runs a
batch as a replay of a graph captured for its shape: the token bucket of its
rows (``CudaBackend.token_bucket``), a power of two of sequences and of the
longest sequence. The runner pads the batch to that shape in its prepare
thread (``graph_batch``); ``run`` copies its tensors into the graph's static
input buffers and replays the graph, whose output buffer the pooler then
reads (one execute thread, so no replay overwrites an output still read).
A graph is captured the first time its shape comes (warm-up captures the
warm-up's shapes), all graphs in one memory pool, at most ``max_graphs`` of
them; a batch of another shape beyond that runs eagerly. Batches the graphs
never take run eagerly too: grouped attention (a relative bias, soft-capping,
masked keys), prefix-cache or chunked-prefill plans, task adapters, and
batches over the largest bucket. A model whose forward cannot be captured
(host syncs, data-dependent shapes) turns the graphs off on the first failure,
logged and reported (``reason``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
from torch import nn

from poolgate.workers.engine.graph_batch import GraphShape, bucket_of, graph_shape, token_buckets
from poolgate.workers.batch.packing import PackedBatch

log = logging.getLogger("poolgate.worker")


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    static: PackedBatch  # the input buffers the graph reads
    out: torch.Tensor  # the output buffer it writes

    def load(self, batch: PackedBatch) -> None:
        self.static.input_ids.copy_(batch.input_ids, non_blocking=True)
        self.static.positions.copy_(batch.positions, non_blocking=True)
        self.static.cu_seqlens.copy_(batch.cu_seqlens, non_blocking=True)
        self.static.seg_ids.copy_(batch.seg_ids, non_blocking=True)
        if self.static.token_type_ids is not None and batch.token_type_ids is not None:
            self.static.token_type_ids.copy_(batch.token_type_ids, non_blocking=True)


class CudaGraphs:
    """The captured graphs of one model (see the module's docstring)."""

    def __init__(self, model: nn.Module, budget: int, longest: int, *, max_graphs: int = 48):
        self.model, self.longest, self.max_graphs = model, longest, max_graphs
        self.buckets = token_buckets(budget)
        self.graphs: dict[GraphShape, _Graph] = {}
        self.failed: str | None = None  # why capture was given up, once it was
        self._pool = None

    def shape(self, batch: PackedBatch) -> GraphShape | None:
        """The shape ``batch`` runs as a graph in, or None: eagerly (host side, in prepare)."""
        if (self.failed is not None or batch.groups is not None or batch.key_masked or batch.prefix is not None
                or batch.adapter_rows is not None):
            return None
        rows = bucket_of(batch.n_tokens, self.buckets)
        if rows is None:
            return None
        shape = graph_shape(batch, rows, self.longest)
        return shape if shape in self.graphs or len(self.graphs) < self.max_graphs else None

    def run(self, shape: GraphShape, batch: PackedBatch) -> torch.Tensor:
        """The model's hidden states for ``batch`` (padded to ``shape``): a replay, or eagerly if capture fails."""
        graph = self.graphs.get(shape)
        if graph is None and self.failed is None:
            graph = self._capture(shape, batch)
        if graph is None:
            return self.model(batch)
        graph.load(batch)
        graph.graph.replay()
        return graph.out

    def _capture(self, shape: GraphShape, batch: PackedBatch) -> _Graph | None:
        static = replace(batch, input_ids=batch.input_ids.clone(), positions=batch.positions.clone(),
                         cu_seqlens=batch.cu_seqlens.clone(), seg_ids=batch.seg_ids.clone(),
                         token_type_ids=None if batch.token_type_ids is None else batch.token_type_ids.clone())
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # the kernels choose their algorithms outside the capture
                self.model(static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the prepare thread's copies and event queries go on during a capture
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = self.model(static)
            self._pool = graph.pool()
        except Exception as exc:  # noqa: BLE001 - any op that cannot be captured: eager from now on
            self.failed = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("CUDA graphs off for this model (%s); batches run eagerly", self.failed)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return None
        self.graphs[shape] = _Graph(graph, static, out)
        log.info("captured a CUDA graph for %d rows, %d sequences, longest %d (%d graphs)", shape.rows,
                 shape.seqs, shape.max_len, len(self.graphs))
        return self.graphs[shape]

    def reason(self) -> str:
        """One line for the kernels report."""
        if self.failed is not None:
            return f"off: capture failed ({self.failed}); batches run eagerly"
        return (f"on: {len(self.buckets)} token buckets {self.buckets[0]}..{self.buckets[-1]}, "
                f"{len(self.graphs)}/{self.max_graphs} graphs captured; grouped, prefix, adapter and larger "
                "batches run eagerly")


def graphs_for(model: nn.Module, backend_name: str, attention: str, budget: int, longest: int, *,
               packed: bool, grouped: bool) -> tuple[CudaGraphs | None, str]:
    """The graphs for a model asked to run with ``--cuda-graphs``, or None and why not (``grouped``: the
    model needs the grouped-SDPA plan in every batch, e.g. a relative bias)."""
    if backend_name != "cuda":
        return None, f"off: CUDA graphs are for the cuda backend, not {backend_name}"
    if not packed:
        return None, "off: the transformers fallback runs padded batches of any shape"
    if attention != "varlen_flash":
        return None, f"off: {attention} plans groups per batch on the host (graphs need varlen flash attention)"
    if grouped:
        return None, "off: this model's attention needs a group plan per batch (relative bias or soft-capping)"
    return CudaGraphs(model, budget, longest), ""
