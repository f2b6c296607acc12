"""The embedding cache: a runner wrapper that answers repeated sequences from memory (opt-in per model).

``--embedding-cache-mb N`` (a model flag; 0 = off) wraps the model's runner
in ``CachingRunner``. A sequence's key is what decides its output in this
model: its pooling params, token ids, token type ids and attended keys (the model is the
worker's own). ``prepare`` looks every sequence up and hands only the misses
to the runner; ``execute`` stores each miss's rows (a copy) and answers every
sequence, hits with the very array a miss stored, so a hit is bit-identical
to the miss that filled it. Entries are kept least-recently-used first out
while their bytes (rows plus key) exceed the bound. ``stats`` (hits, misses,
entries, bytes) goes out in the worker's ``health`` answer and from there to
the gateway's metrics. Both runner threads touch the table, under one lock.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import astuple, dataclass, fields
from typing import Any

from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows
from poolgate.workers.engine.runner_api import RunOutput, Runner, Step, join_outputs
from poolgate.workers.engine.sequence import Sequence

Key = tuple
Entry = tuple[Rows, tuple[Rows, ...]]  # one sequence's rows, and its further outputs' rows (a multi-output call)


def key_of(seq: Sequence) -> Key:
    types = tuple(seq.token_type_ids) if seq.token_type_ids is not None else None
    attend = tuple(seq.attend) if seq.attend is not None else None
    media = tuple(m.digest for m in seq.media) if seq.media is not None else None  # the decoded pixels' hashes
    return astuple(seq.params), tuple(seq.token_ids), types, attend, media


@dataclass
class _Batch:
    keys: list[Key]
    hits: dict[int, Entry]  # sequence index -> its cached rows (and a multi-output call's further rows)
    misses: list[int]  # the sequence indexes the runner runs, in order
    inner: Any  # the runner's prepared batch of the misses (None: all hits)
    chunks: set[int]  # sequences that are one chunk of a long input (engine.chunked_prefill): never stored


class CachingRunner:
    """A ``Runner`` that serves repeated sequences from an LRU table bounded by ``max_bytes``."""

    def __init__(self, runner: Runner, max_bytes: int):
        self.runner, self.max_bytes = runner, max_bytes
        self._table: OrderedDict[Key, tuple[Entry, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.bytes = 0

    def prepare(self, seqs: list[Sequence]) -> _Batch:
        keys = [key_of(s) for s in seqs]
        hits: dict[int, Entry] = {}
        with self._lock:
            for i, key in enumerate(keys):
                entry = None if seqs[i].prefill is not None else self._table.get(key)  # a chunk: never a hit
                if entry is not None:
                    self._table.move_to_end(key)
                    hits[i] = entry[0]
            self.hits += len(hits)
            self.misses += len(seqs) - len(hits)
        misses = [i for i in range(len(seqs)) if i not in hits]
        inner = self.runner.prepare([seqs[i] for i in misses]) if misses else None
        return _Batch(keys, hits, misses, inner, {i for i, s in enumerate(seqs) if s.prefill is not None})

    def execute(self, batch: _Batch, steps: list[Step] | None = None) -> list[RunOutput]:
        rows = dict(batch.hits)
        if batch.inner is not None:
            for run in join_outputs(self.runner.execute(batch.inner, steps)):
                for j in range(run.start, run.stop):
                    k = j - run.start
                    rows[batch.misses[j]] = (_copy(run.rows, k), tuple(_copy(more, k) for more in run.more))
            self._store([(batch.keys[i], rows[i]) for i in batch.misses if i not in batch.chunks])
        return [RunOutput(i, i + 1, *rows[i]) for i in range(len(batch.keys))]

    def _store(self, entries: list[tuple[Key, Entry]]) -> None:
        with self._lock:
            for key, rows in entries:
                size = sum(r.values.nbytes for r in (rows[0], *rows[1])) + 8 * len(key[1]) + 64
                if key in self._table or size > self.max_bytes:
                    continue
                self._table[key] = (rows, size)
                self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, size) = self._table.popitem(last=False)
                self.bytes -= size

    def forget_lora(self, name: str) -> None:
        """Drop the outputs of calls that ran LoRA adapter ``name`` (it was unloaded, or loaded anew)."""
        at = [f.name for f in fields(PoolingParams)].index("lora")
        with self._lock:
            for key in [k for k in self._table if k[0][at] == name]:
                self.bytes -= self._table.pop(key)[1]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "entries": len(self._table), "bytes": self.bytes}


def _copy(rows: Rows, k: int) -> Rows:
    """Sequence ``k``'s rows of a run, copied out of the batch's block."""
    one = rows.slice(k, k + 1)
    return Rows(one.values.copy(), None if one.offsets is None else one.offsets.copy())
