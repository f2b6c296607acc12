"""Token-budget continuous batching: a batch is what queued while the last one ran.

Pure Python and thread-safe: the event loop ``add``s tokenized sequences, the
engine thread blocks in ``next_batch``. There is no wait timer: at low load a
lone request runs at once; under load the queue fills while the device works
and the next batch takes everything that fits the token budget (the policy's,
at most ``max_batch_tokens``), in the order the batch policy chooses
(``workers.engine.policy``: FIFO by default here; the engine uses ``fair``). The
first item always goes, even when it alone is over budget (a single input
longer than the budget must still run). Items whose client left
(``.cancelled``) are dropped wherever they sit and never returned.

With ``padded=True`` (the transformers fallback, which pads every sequence
to the batch's longest) a batch costs ``count × longest`` tokens, not the sum,
so the budget bounds the work the device really does.

The queue is bounded: ``add_all`` refuses a call's sequences with ``Overloaded``
(429; the gateway tries another worker, then the next pool) when they would take
the queued tokens past ``max_queued_tokens``, unless the queue is empty (a lone
call bigger than the bound still runs). A call is queued whole or not at all.
Bulk work (``shared.domain.lanes``) never refuses live work: a live call counts
only the live tokens queued (and is taken when no live work is), a bulk call
counts all of them, so bulk holds at most the bound and live work the bound
besides.
The refusal's ``reason`` is ``queue_full`` and its ``retry_after_s`` the time the
queue needs, at the measured rate, to make room for the call.

``next_batch(hold=...)`` lets the engine cut the next batch early, while the
device still runs the last one, but only once a full budget of live work is
queued: while ``hold()`` is true a partial batch, and bulk work however much
of it, waits (``wake`` re-checks it). So a batch job's work is never prepared
ahead to stand between a live call that arrives and the device (it loses only
the overlap of its own small prepare step).
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable

from poolgate.shared.domain.errors import Overloaded, Unavailable
from poolgate.workers.engine.fair_policy import FairPolicy
from poolgate.workers.engine.policy import BatchCut, BatchPolicy, FifoPolicy, Schedulable, is_bulk

__all__ = ["POLICIES", "Schedulable", "TokenBudgetScheduler"]

# The batch policies by name (``workers.engine.policy``); the engine's default is "fair".
POLICIES: dict[str, Callable[[], BatchPolicy]] = {"fifo": FifoPolicy, "fair": FairPolicy}


class TokenBudgetScheduler:
    """A bounded queue that hands out batches of at most ``max_batch_tokens`` tokens (padded ones if
    ``padded``), in ``policy``'s order (default FIFO); ``max_queued_tokens`` None = unbounded."""

    def __init__(self, max_batch_tokens: int, *, padded: bool = False, policy: BatchPolicy | None = None,
                 max_queued_tokens: int | None = None):
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if max_queued_tokens is not None and max_queued_tokens < 1:
            raise ValueError(f"max_queued_tokens must be >= 1, got {max_queued_tokens}")
        self.max_batch_tokens = max_batch_tokens
        self.max_queued_tokens = max_queued_tokens
        self.padded = padded
        self._policy: BatchPolicy = policy if policy is not None else FifoPolicy()
        self._tokens = 0
        self._bulk_tokens = 0  # of ``_tokens``, those of bulk items
        self._closed = False
        self._cond = threading.Condition()
        self.tokens_per_s: float | None = None  # the worker's measured rate (the engine sets it): the policy's budget

    def _room_in_s(self, excess_tokens: int) -> float | None:
        """When the queue will have drained ``excess_tokens`` at the measured rate, in whole seconds (1 to 60);
        None before a batch was measured (the gateway then says 1 s)."""
        if not self.tokens_per_s:
            return None
        return float(min(60, max(1, math.ceil(excess_tokens / self.tokens_per_s))))

    def add(self, item: Schedulable) -> None:
        """Queue one item and wake a waiting ``next_batch``."""
        self.add_all([item])

    def add_all(self, items: list[Schedulable]) -> None:
        """Queue a call's items together, or none of them (``Overloaded`` past the bound; module doc)."""
        tokens = sum(item.num_tokens for item in items)
        bulk = _bulk_tokens(items)
        lane_bulk = any(is_bulk(item) for item in items)  # a call's items share its lane
        with self._cond:
            if self._closed:
                raise Unavailable("worker is shutting down")
            bound = self.max_queued_tokens
            ahead = self._ahead(lane_bulk)
            if bound is not None and ahead and ahead + tokens > bound:
                self._purge()
                ahead = self._ahead(lane_bulk)
                if ahead and ahead + tokens > bound:
                    raise Overloaded(f"The worker's queue is full ({ahead} tokens queued, the limit is "
                                     f"{bound}); retry shortly.", reason="queue_full",
                                     retry_after_s=self._room_in_s(ahead + tokens - bound))
            for item in items:
                self._policy.add(item)
            self._tokens += tokens
            self._bulk_tokens += bulk
            self._cond.notify()

    def requeue(self, items: list[Schedulable]) -> None:
        """Queue the next pieces of work already admitted (long inputs' next chunks, ``engine.chunked_prefill``):
        never refused by the bound, only when closed (``Unavailable``)."""
        if not items:
            return
        with self._cond:
            if self._closed:
                raise Unavailable("worker is shutting down")
            for item in items:
                self._policy.add(item)
            self._tokens += sum(item.num_tokens for item in items)
            self._bulk_tokens += _bulk_tokens(items)
            self._cond.notify()

    def _ahead(self, bulk: bool) -> int:
        """The queued tokens a new call counts against the bound: all for bulk, the live ones for live."""
        return self._tokens if bulk else self._tokens - self._bulk_tokens

    def next_batch(self, timeout: float | None = None, *,
                   hold: Callable[[], bool] | None = None) -> list[Schedulable]:
        """Block until something is queued, then cut a batch; [] on timeout or close.

        While ``hold()`` is true, wait for a full budget of queued live tokens instead."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                if hold is None or self._tokens - self._bulk_tokens >= self._budget() or not hold():
                    batch = self._cut()
                    if batch:
                        return batch
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                self._cond.wait(remaining)
            return []

    def wake(self) -> None:
        """Make a waiting ``next_batch`` look at its ``hold`` again."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> list[Schedulable]:
        """Stop handing out batches, wake every waiter; returns what was still queued."""
        with self._cond:
            self._closed = True
            left = [item for item in self._policy.remove(lambda item: True) if not item.cancelled]
            self._tokens = self._bulk_tokens = 0
            self._cond.notify_all()
            return left

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def queued(self) -> int:
        """Items waiting (cancelled ones are purged first)."""
        with self._cond:
            self._purge()
            return len(self._policy)

    @property
    def queued_tokens(self) -> int:
        """Tokens waiting (cancelled ones are purged first)."""
        with self._cond:
            self._purge()
            return self._tokens

    def _cut(self) -> list[Schedulable]:
        """The policy's next batch within the budget; cancelled items it met are gone from the count."""
        batch = BatchCut(self._budget(), padded=self.padded)
        self._policy.cut(batch)
        gone = [*batch.items, *batch.dropped]
        self._tokens -= sum(item.num_tokens for item in gone)
        self._bulk_tokens -= _bulk_tokens(gone)
        return batch.items

    def _budget(self) -> int:
        return self._policy.budget(self.max_batch_tokens, self.tokens_per_s)

    def _purge(self) -> None:
        gone = self._policy.remove(lambda item: item.cancelled)
        self._tokens -= sum(item.num_tokens for item in gone)
        self._bulk_tokens -= _bulk_tokens(gone)


def _bulk_tokens(items: list[Schedulable]) -> int:
    return sum(item.num_tokens for item in items if is_bulk(item))
