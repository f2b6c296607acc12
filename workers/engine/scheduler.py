"""Token-budget continuous batching: a batch is what queued while the last one ran.

Pure Python and thread-safe: the event loop ``add``s tokenized sequences, the
engine thread blocks in ``next_batch``. There is no wait timer: at low load a
lone request runs at once; under load the queue fills while the device works
and the next batch takes, first in first out, everything that fits the token
budget. The head of the queue always goes, even when it alone is over budget
(a single input longer than the budget must still run). Items whose client
left (``.cancelled``) are dropped wherever they sit and never returned.

With ``padded=True`` (the transformers fallback, which pads every sequence
to the batch's longest) a batch costs ``count × longest`` tokens, not the sum,
so the budget bounds the work the device really does.

``next_batch(hold=...)`` lets the engine cut the next batch early, while the
device still runs the last one, but only once a full budget is queued: while
``hold()`` is true a partial batch waits (``wake`` re-checks it).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Protocol

from poolgate.shared.errors import Unavailable


class Schedulable(Protocol):
    num_tokens: int
    cancelled: bool


class TokenBudgetScheduler:
    """A FIFO queue that hands out batches of at most ``max_batch_tokens`` tokens (padded ones if ``padded``)."""

    def __init__(self, max_batch_tokens: int, *, padded: bool = False):
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.max_batch_tokens = max_batch_tokens
        self.padded = padded
        self._queue: deque[Schedulable] = deque()
        self._tokens = 0
        self._closed = False
        self._cond = threading.Condition()

    def add(self, item: Schedulable) -> None:
        """Queue one item and wake a waiting ``next_batch``."""
        with self._cond:
            if self._closed:
                raise Unavailable("worker is shutting down")
            self._queue.append(item)
            self._tokens += item.num_tokens
            self._cond.notify()

    def next_batch(self, timeout: float | None = None, *,
                   hold: Callable[[], bool] | None = None) -> list[Schedulable]:
        """Block until something is queued, then cut a batch; [] on timeout or close.

        While ``hold()`` is true, wait for a full budget of queued tokens instead."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                if hold is None or self._tokens >= self.max_batch_tokens or not hold():
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
            left = [item for item in self._queue if not item.cancelled]
            self._queue.clear()
            self._tokens = 0
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
            return len(self._queue)

    @property
    def queued_tokens(self) -> int:
        """Tokens waiting (cancelled ones are purged first)."""
        with self._cond:
            self._purge()
            return self._tokens

    def _cut(self) -> list[Schedulable]:
        """Pop, FIFO, live items while the batch's cost fits the budget; the first live item always goes."""
        batch: list[Schedulable] = []
        used = longest = 0
        while self._queue:
            head = self._queue[0]
            if head.cancelled:
                self._pop()
                continue
            longest = max(longest, head.num_tokens)
            cost = (len(batch) + 1) * longest if self.padded else used + head.num_tokens
            if batch and cost > self.max_batch_tokens:
                break
            batch.append(self._pop())
            used = cost
        return batch

    def _pop(self) -> Schedulable:
        item = self._queue.popleft()
        self._tokens -= item.num_tokens
        return item

    def _purge(self) -> None:
        if any(item.cancelled for item in self._queue):
            self._queue = deque(item for item in self._queue if not item.cancelled)
            self._tokens = sum(item.num_tokens for item in self._queue)
