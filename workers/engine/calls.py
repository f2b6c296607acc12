"""One call inside the engine: its checks, its future, its sequences and the rows gathered so far (and its runs in a batch)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from poolgate.shared.domain.errors import DeadlineExceeded, InternalError, PoolgateError
from poolgate.shared.wire.rows import Rows
from poolgate.workers.engine.chunking import Chunks, fold
from poolgate.workers.engine.runner_api import Step
from poolgate.workers.engine.sequence import Sequence


@dataclass(eq=False)
class Call:
    """One call inside the engine: its future, its sequences and the rows gathered so far."""

    future: asyncio.Future
    seqs: list[Sequence] = field(default_factory=list)
    pieces: list[Rows] = field(default_factory=list)  # touched by the execute thread only
    more: list[tuple[Rows, ...]] = field(default_factory=list)  # a multi-output call's further outputs, per piece
    chunks: Chunks | None = None  # how long inputs were split into sequences (None: one sequence each)
    # chunked prefill (engine.chunked_prefill): each sequence's index (by id), and the rows delivered so far
    # by index, since a long input's row comes after those of the short inputs queued behind it
    order: dict[int, int] | None = None
    slots: dict[int, Rows] = field(default_factory=dict)
    done: int = 0
    failed: bool = False
    queued_at: float = 0.0  # perf_counter when its sequences were queued
    started: float | None = None  # perf_counter when its first batch began executing
    finished: float = 0.0  # perf_counter when its last batch finished
    steps: list[Step] = field(default_factory=list)  # the runner's forward/pool steps, for detailed traces

    def timings(self) -> dict[str, float]:
        """vLLM's split: time in queue (queued → first execute), in inference (first execute → done)."""
        started = self.queued_at if self.started is None else self.started
        return {"queue_s": started - self.queued_at, "inference_s": self.finished - started}

    def rows(self) -> Rows:
        """The call's outputs, one row per input: its pieces joined, chunked inputs folded back."""
        rows = Rows.concat(self.pieces if self.order is None else [self.slots[i] for i in range(len(self.seqs))])
        return rows if self.chunks is None else fold(rows, self.chunks)

    def take(self, rows: Rows, first: int, seqs: list[tuple[int, Sequence, bool]]) -> bool:
        """Keep the rows (batch index ``j`` is row ``j - first`` of ``rows``) of ``seqs`` by their input index,
        of a chunk that does not pool (``partial``) only its token rows under ALL; whether the call is now
        complete (chunked prefill, ``order``)."""
        assert self.order is not None
        for j, seq, partial in seqs:
            row, pf = rows.slice(j - first, j - first + 1), seq.prefill
            if partial:
                if pf.rows is not None:
                    pf.rows.append(row)
                continue
            self.slots[self.order[id(seq)]] = row if pf is None else pf.joined(row)
        return len(self.slots) == len(self.seqs)

    def more_rows(self, count: int) -> list[Rows]:
        """A multi-output call's ``count`` further outputs, each one row block over the inputs (never chunked)."""
        if any(len(piece) != count for piece in self.more) or len(self.more) != len(self.pieces):
            raise InternalError(f"the runner did not answer the call's {count} further outputs")
        return [Rows.concat(list(blocks)) for blocks in zip(*self.more)]

    def abandon(self) -> None:
        """Never run what is left of this call (it failed, or its client left)."""
        self.failed = True
        for seq in self.seqs:
            seq.cancelled = True
            if seq.prefill is not None:  # its remaining chunks never run: their kept K/V (and rows) go now
                seq.prefill.free()
                seq.prefill.rows = None


def call_runs(seqs: list[Sequence]) -> list[tuple[int, int, Call]]:
    """Runs of consecutive sequences that belong to one call."""
    out, start = [], 0
    for i in range(1, len(seqs) + 1):
        if i == len(seqs) or seqs[i].handle is not seqs[start].handle:
            out.append((start, i, seqs[start].handle))
            start = i
    return out


def calls_of(seqs: list[Sequence]) -> list[Call]:
    return list({id(seq.handle): seq.handle for seq in seqs}.values())


def resolve(finished: list[tuple[Call, Rows]]) -> None:
    """On the loop: hand each complete call its rows."""
    for call, rows in finished:
        if not call.future.done():
            call.future.set_result(rows)


def settle(calls: list[Call], error: PoolgateError) -> None:
    """On the loop: fail each still-pending call with its own copy of ``error``."""
    for call in calls:
        if not call.future.done():
            call.future.set_exception(error.copy())


def check_deadline(deadline: float | None) -> None:
    """A call whose deadline (epoch seconds) has passed is not scheduled."""
    if deadline is not None and deadline < time.time():
        raise DeadlineExceeded("deadline exceeded before the request was scheduled")
