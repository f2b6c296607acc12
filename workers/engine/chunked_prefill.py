"""Chunked prefill: a causal input longer than the token budget runs in chunks whose K/V are kept between them.

vLLM's ``enable_chunked_prefill`` for pooling models, on where vLLM turns it on
by default: a packed causal decoder (``supports_prefix``) and a call whose task
pools LAST (embed, classify, the yes/no reranker's score) or ALL over every token
(``token_embed``, ``token_classify``), one output per call, no task or LoRA adapter, no
PyLate key mask (``eligible``). The engine (``start_chunks``) cuts such an input
longer than the worker's token budget into chunks of half the budget (short
requests still fit in every batch beside a chunk) and queues one ``Sequence`` for
it whose ``token_ids`` are its current chunk and whose ``prefill`` is a
``Prefill``: the whole input, where the chunk starts, and the keys and values
(after RoPE, every layer, in the model's dtype) of every token before it, in one
tensor per input that nothing else can evict. The chunk runs in whatever batch
the scheduler forms: its queries, at their true positions, attend causally to
[stored K/V ; its own] (``plan``, ``workers.models.chunk_plan``: the chunk's rows
only, against the whole prefix's keys, by SDPA with the mask's last rows; the
batch's other sequences through the backend's attention as always), and its rows'
K/V are written into the store after the forward (``keep``). Only then does the
engine queue the next chunk (``next_chunks``): chunks of one input run in order,
one per batch. The last chunk pools (LAST: its
last row, the input's last token) and its row is the input's; the earlier chunks'
pooled rows are dropped, or under ALL kept and joined in order before the last
chunk's. A call that fails, passes its deadline or is cancelled drops its
remaining chunks and frees its store (``workers.engine.calls.Call.abandon``).

Exact: a token's K/V depend only on the tokens up to it, so each chunk's rows
equal the unchunked forward's (tests/workers/engine/test_chunked_prefill.py).
Cost: a chunk computes only its own rows: the linear layers do the work of one
forward over the whole input, and a chunk's attention that of its queries against
its prefix's keys (a lower-right causal mask, dense ``n × (prefix + n)`` bool), so
the input's attention adds up to one forward's. The store holds ``layers × 2 ×
tokens × kv_heads × head_dim`` values for the input's life. A batch holding a
chunk neither reads nor fills the prefix cache. Pooling that reads other rows
(MEAN, CLS, STEP, SPLADE, ALL with a row selector) is not served here: such inputs
run whole (or, MEAN embed with chunked processing, as averaged windows:
``workers.engine.chunking``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from poolgate.shared.wire.rows import Rows
from poolgate.workers.models.chunk_plan import ChunkPlan, ChunkSpan
from poolgate.workers.batch.packing import pack
from poolgate.workers.models.prefix import PrefixPlan
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.pooling.dispatch import DispatchPooler
from poolgate.workers.pooling.rows import all_rows

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Prefill:
    """One long input's progress: its tokens, the current chunk ``[start, end)`` and the K/V of ``[0, start)``."""

    ids: list[int]
    size: int  # tokens per chunk
    start: int = 0
    kv: torch.Tensor | None = None  # (layers, 2, len(ids), kv_heads, d); rows [0, start) are filled
    dropped: bool = False  # its call failed or left: nothing more is kept
    like: tuple | None = None  # the store's (shape, dtype, device), kept after it is freed
    rows: list[Rows] | None = None  # ALL pooling: the earlier chunks' token rows, in order (None: LAST)

    @property
    def end(self) -> int:
        return min(self.start + self.size, len(self.ids))

    @property
    def final(self) -> bool:
        """Whether the current chunk is the input's last (the one that pools)."""
        return self.end == len(self.ids)

    def chunk(self) -> list[int]:
        return self.ids[self.start:self.end]

    def advance(self) -> list[int]:
        """Move to the next chunk (the current one's K/V are kept); its token ids."""
        self.start = self.end
        return self.chunk()

    def free(self) -> None:
        self.kv, self.dropped = None, True

    def known(self) -> torch.Tensor:
        """The kept K/V of ``[0, start)``; zeros when the call was dropped meanwhile (the loop frees the store
        while the prepare thread may be planning its chunk, whose rows then go nowhere)."""
        kv = self.kv
        if kv is not None:
            return kv[:, :, :self.start]
        assert self.like is not None
        shape, dtype, device = self.like
        return torch.zeros(shape[0], 2, self.start, *shape[3:], dtype=dtype, device=device)

    def joined(self, last: Rows) -> Rows:
        """The input's row: ``last`` (the final chunk's), after the earlier chunks' token rows under ALL."""
        if not self.rows:
            return last
        values = np.concatenate([r.values for r in (*self.rows, last)])
        self.rows = []
        return Rows(values, np.array([0, len(values)], dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return 0 if self.kv is None else self.kv.nbytes


class ChunkedPrefill:
    """Which sequences run in chunks, and the layout of a batch that holds chunks."""

    def __init__(self, pooler: DispatchPooler, *, group_attention: bool = True):
        self.pooler, self.group_attention = pooler, group_attention

    def eligible(self, seq: Sequence) -> bool:
        """Whether the sequence's call pools only its last token (one output, causal-safe, no key mask)."""
        p = seq.params
        if seq.attend is not None or p.adapter is not None or p.lora is not None or p.sparse or p.outputs:
            return False
        pooler = self.pooler.poolers.get(p.task)
        if pooler is None or pooler.pool is not None:
            return False
        return pooler.method == "LAST" or (pooler.method == "ALL" and pooler.rows is all_rows)

    def per_token(self, seq: Sequence) -> bool:
        """Whether the sequence's task keeps a row per token (ALL: every chunk's rows are the input's)."""
        return self.pooler.poolers[seq.params.task].per_token

    def plan(self, seqs: list[Sequence]) -> tuple[list[int], ChunkPlan]:
        """Each sequence's known prefix (a chunk's start, 0 for others) and the layout that runs the batch."""
        starts = [0 if s.prefill is None else s.prefill.start for s in seqs]
        spans, rest, rest_rows, capture, chunks = [], [], [], [], []
        at = 0
        for seq in seqs:
            pf, n = seq.prefill, seq.num_tokens
            if pf is None:
                rest.append(seq.token_ids)
                rest_rows.append(np.arange(at, at + n))
            else:
                spans.append(ChunkSpan(at, n, pf.start, pf.known() if pf.start else None))
                if not pf.final:  # the next chunk reads this one's K/V
                    capture.append(np.arange(at, at + n))
                    chunks.append(pf)
            at += n
        plan = ChunkPlan(
            None, None, capture=torch.from_numpy(np.concatenate(capture)) if capture else None,
            rest=pack(rest, group_attention=self.group_attention) if rest else None,
            rest_rows=torch.from_numpy(np.concatenate(rest_rows)) if rest_rows else None, spans=spans)
        plan.chunks = chunks
        return starts, plan

    @staticmethod
    def keep(plan: PrefixPlan) -> None:
        """Write each chunk's K/V (``plan.kept``, per layer, the captured rows in batch order) into its store."""
        if not plan.chunks or not plan.kept:
            return
        k = torch.stack([pair[0] for pair in plan.kept])  # (layers, n_capture, kv_heads, d)
        v = torch.stack([pair[1] for pair in plan.kept])
        plan.kept.clear()
        at = 0
        for pf in plan.chunks:
            n = pf.end - pf.start
            if pf.kv is None and not pf.dropped:  # the first chunk: the store for the whole input, once
                pf.kv = k.new_empty(k.shape[0], 2, len(pf.ids), *k.shape[2:])
                pf.like = (tuple(pf.kv.shape), pf.kv.dtype, pf.kv.device)
            if pf.kv is not None:
                pf.kv[:, 0, pf.start:pf.end] = k[:, at:at + n]
                pf.kv[:, 1, pf.start:pf.end] = v[:, at:at + n]
            at += n


def start_chunks(seqs: list[Sequence], chunked: ChunkedPrefill, budget: int) -> bool:
    """Inputs over ``budget`` that may run in chunks start with their first chunk (of half the budget);
    whether any does."""
    any_chunked = False
    for seq in seqs:
        if seq.num_tokens > budget and seq.token_type_ids is None and chunked.eligible(seq):
            seq.prefill = Prefill(seq.token_ids, max(1, budget // 2), rows=[] if chunked.per_token(seq) else None)
            seq.token_ids = seq.prefill.chunk()
            any_chunked = True
    return any_chunked


def next_chunks(seqs: list[Sequence]) -> tuple[set[int], list[Sequence]]:
    """After a batch ran: the indexes of its chunks that do not pool, and those inputs, moved to their next
    chunk (to queue again); a final or dropped input's store is freed."""
    partial, more = set(), []
    for i, seq in enumerate(seqs):
        pf = seq.prefill
        if pf is None:
            continue
        if not pf.final:
            partial.add(i)
        if pf.final or seq.cancelled or pf.dropped:
            pf.free()
            continue
        seq.token_ids = pf.advance()
        more.append(seq)
    return partial, more


def for_model(model: torch.nn.Module, pooler: DispatchPooler, *, group_attention: bool) -> ChunkedPrefill | None:
    """Chunked prefill for a packed causal decoder with a LAST-pooled task; None for anything else."""
    config = getattr(model, "config", None)
    if not getattr(model, "supports_prefix", False) or config is None or not config.causal:
        return None
    if not any(p.method == "LAST" and p.pool is None for p in pooler.poolers.values()):
        return None
    log.info("chunked prefill: LAST-pooled inputs over the token budget run in chunks of half of it")
    return ChunkedPrefill(pooler, group_attention=group_attention)
