"""The scheduler's batch cut as a policy object: which queued sequences make the next batch.

A policy holds the queue (``add``, ``remove``, iteration, ``len``), says the
budget of the next batch (``budget``: the full ``max_batch_tokens``, or less under
mixed load given the worker's measured token rate) and fills one ``BatchCut`` at
a time from it; the scheduler (``workers.engine.scheduler``) owns the lock, the
token count, blocking and closing. ``BatchCut`` is the
budget: ``fits(item)`` says whether one more item keeps the batch's cost within
``max_batch_tokens`` (packed: the sum of lengths; padded: count × longest), and
is always true for the first item (an input longer than the budget still runs,
alone). A policy ``take``s what goes in and ``drop``s cancelled items it meets.

Every policy puts a bulk item (``lane == "bulk"``, ``shared.domain.lanes``:
a batch job's line) after every live one: bulk gets only the budget live work
leaves, and all of it when no live work is queued.

Policies (``POLICIES``, by name):

- ``fifo``: first in, first out within each lane, live before bulk; an item
  that does not fit ends the batch (nothing jumps the queue); always the full
  budget.
- ``fair`` (``workers.engine.fair_policy``, the worker's default): priority
  lanes with aging, round robin over the calls of a lane, bulk after every
  live level, a budget bounded in device time under mixed load.
"""
from __future__ import annotations

import itertools
from collections import deque
from typing import Any, Callable, Iterator, Protocol

from poolgate.shared.domain.lanes import BULK


class Schedulable(Protocol):
    """What the scheduler needs of a queued item (``workers.engine.sequence.Sequence``)."""

    num_tokens: int
    cancelled: bool


def is_bulk(item: Any) -> bool:
    """Whether ``item`` is in the bulk lane (an item without a lane is live)."""
    return getattr(item, "lane", None) == BULK


class BatchCut:
    """One batch being cut: its items and its cost against the token budget (module doc)."""

    def __init__(self, max_batch_tokens: int, *, padded: bool = False):
        self.max_batch_tokens = max_batch_tokens
        self.padded = padded
        self.items: list[Schedulable] = []
        self.dropped: list[Schedulable] = []
        self._used = 0
        self._longest = 0

    def cost_with(self, item: Schedulable) -> int:
        longest = max(self._longest, item.num_tokens)
        return (len(self.items) + 1) * longest if self.padded else self._used + item.num_tokens

    def fits(self, item: Schedulable, limit: int | None = None) -> bool:
        """Whether ``item`` goes in within the budget (or the lower ``limit``); the first item always does."""
        cap = self.max_batch_tokens if limit is None else min(limit, self.max_batch_tokens)
        return not self.items or self.cost_with(item) <= cap

    @property
    def used(self) -> int:
        """The tokens the batch costs so far."""
        return self._used

    def take(self, item: Schedulable) -> None:
        self._used = self.cost_with(item)
        self._longest = max(self._longest, item.num_tokens)
        self.items.append(item)

    def drop(self, item: Schedulable) -> None:
        """A cancelled item the policy took off its queue (never handed out)."""
        self.dropped.append(item)


class BatchPolicy(Protocol):
    """A queue that cuts batches (module doc). Not thread-safe: the scheduler holds its lock."""

    def add(self, item: Schedulable) -> None: ...

    def budget(self, max_batch_tokens: int, tokens_per_s: float | None) -> int: ...

    def cut(self, batch: BatchCut) -> None: ...

    def remove(self, doomed: Callable[[Schedulable], bool]) -> list[Schedulable]: ...

    def __iter__(self) -> Iterator[Schedulable]: ...

    def __len__(self) -> int: ...


class FifoPolicy:
    """First in, first out up to the budget, live before bulk (module doc)."""

    def __init__(self) -> None:
        self._queue: deque[Schedulable] = deque()  # live items
        self._bulk: deque[Schedulable] = deque()

    def add(self, item: Schedulable) -> None:
        (self._bulk if is_bulk(item) else self._queue).append(item)

    def budget(self, max_batch_tokens: int, tokens_per_s: float | None) -> int:
        return max_batch_tokens

    def cut(self, batch: BatchCut) -> None:
        for lane in (self._queue, self._bulk):
            while lane:
                head = lane[0]
                if head.cancelled:
                    batch.drop(lane.popleft())
                elif batch.fits(head):
                    batch.take(lane.popleft())
                else:
                    return

    def remove(self, doomed: Callable[[Schedulable], bool]) -> list[Schedulable]:
        """Take every item ``doomed`` says out of the queue; returns them."""
        gone = [item for item in self if doomed(item)]
        if gone:
            self._queue = deque(item for item in self._queue if not doomed(item))
            self._bulk = deque(item for item in self._bulk if not doomed(item))
        return gone

    def __iter__(self) -> Iterator[Schedulable]:
        return itertools.chain(self._queue, self._bulk)

    def __len__(self) -> int:
        return len(self._queue) + len(self._bulk)
