"""The priority + fairness batch policy: priority levels with aging, round robin over a level's calls, bulk last.

The worker's default batch cut (``workers.engine.policy`` describes the
contract). Queued sequences are grouped by call (``Sequence.handle``); a call
has its sequences' priority (lower runs earlier), lane (``live`` or ``bulk``,
``shared.domain.lanes``) and arrival. Each cut:

1. **Levels.** A live call's level is its priority lifted one step per
   ``aging_s`` seconds it has waited, never past the best priority of the live
   calls queued; so live work at priority 10 still runs beside a stream of
   priority-0 calls (after ``10 × aging_s`` it shares their level), but never
   overtakes them.
2. **Bulk last.** Bulk calls (a batch job's lines) form levels of their own
   after every live level, whatever their priority and however long they
   wait: they never age into a live level, so a bulk call queued long before a
   stream of live calls still runs only on what those leave. Among themselves
   they are ordered and aged as live calls are (by priority, lifted one step
   per ``aging_s``, never past the best bulk priority queued). With no live
   work queued, bulk fills the whole batch, so a lone job runs at full speed;
   beside live work it takes at most ``BULK_BESIDE_LIVE`` (a quarter) of the
   budget, so a batch that carries a live call is short.
3. **Round robin.** Within a level, calls take one sequence each in turn,
   oldest call first, so a call of 2,048 inputs fills the batch only with what
   the others leave: a 1-input call beside it is in the next batch, not after
   the big one's last input. A sequence that does not fit is skipped for this
   batch (smaller ones may); the first sequence always goes. What one level
   leaves of the budget goes to the next (and what the live levels leave, to
   bulk).
4. **A budget bounded in time.** A batch is at most about ``max_batch_s`` of
   device time at the worker's measured token rate (never below
   ``min_batch_tokens``, never above ``max_batch_tokens``), so no batch holds
   the device long: a call that arrives waits for at most the running batch
   and the one prepared behind it. Even a lone big call runs in such batches,
   since the batch prepared while one runs is cut before anyone else arrives;
   so does bulk work. Bulk work alone is never cut early, though (the
   scheduler cuts a batch while one runs only for a full budget of live work,
   ``workers.engine.scheduler``): so a live call that arrives while a job runs
   waits for the running batch only, then runs in a short one.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from poolgate.workers.engine.policy import BatchCut, Schedulable, is_bulk

# The most of a batch's budget bulk work takes in a batch with live work (module doc, 2.)
BULK_BESIDE_LIVE = 0.25


@dataclass(eq=False)
class _CallQueue:
    """One call's queued sequences, in input order."""

    priority: int
    arrival: float
    order: int  # insertion order: ties on arrival keep it
    bulk: bool = False
    items: deque = field(default_factory=deque)


class FairPolicy:
    """Priority levels with aging, bulk after every live level, round robin over calls, a budget bounded in
    time (module doc)."""

    def __init__(self, *, aging_s: float = 1.0, max_batch_s: float = 0.25, min_batch_tokens: int = 256):
        if aging_s <= 0 or max_batch_s <= 0 or min_batch_tokens < 1:
            raise ValueError("aging_s and max_batch_s must be > 0 and min_batch_tokens >= 1")
        self.aging_s, self.max_batch_s, self.min_batch_tokens = aging_s, max_batch_s, min_batch_tokens
        self._calls: dict[int, _CallQueue] = {}
        self._count = 0
        self._added = 0

    def add(self, item: Schedulable) -> None:
        key = id(_call_of(item))
        queue = self._calls.get(key)
        if queue is None:
            self._added += 1
            queue = self._calls[key] = _CallQueue(getattr(item, "priority", 0),
                                                  getattr(item, "arrival", time.monotonic()), self._added,
                                                  is_bulk(item))
        queue.items.append(item)
        self._count += 1

    def budget(self, max_batch_tokens: int, tokens_per_s: float | None) -> int:
        """About ``max_batch_s`` of device time at ``tokens_per_s`` (module doc); the full budget until
        the rate is known."""
        if not tokens_per_s:
            return max_batch_tokens
        return min(max_batch_tokens, max(self.min_batch_tokens, int(tokens_per_s * self.max_batch_s)))

    def cut(self, batch: BatchCut) -> None:
        now = time.monotonic()
        calls = list(self._calls.values())
        for level in self._aged([c for c in calls if not c.bulk], now):
            self._fill(level, batch, None)
        limit = None  # bulk beside live work takes at most BULK_BESIDE_LIVE of the budget (module doc)
        if batch.items:
            limit = batch.used + max(1, int(batch.max_batch_tokens * BULK_BESIDE_LIVE))
        for level in self._aged([c for c in calls if c.bulk], now):
            self._fill(level, batch, limit)
        self._calls = {k: q for k, q in self._calls.items() if q.items}

    def _fill(self, level: list[_CallQueue], batch: BatchCut, limit: int | None) -> None:
        """Round robin over one level's calls, one sequence each in turn, while they fit."""
        turn = deque(level)
        while turn:
            call = turn.popleft()
            while call.items and call.items[0].cancelled:
                self._pop(call, batch.drop)
            if not call.items or not batch.fits(call.items[0], limit):
                continue
            self._pop(call, batch.take)
            if call.items:
                turn.append(call)

    def remove(self, doomed: Callable[[Schedulable], bool]) -> list[Schedulable]:
        gone = []
        for call in self._calls.values():
            if any(doomed(item) for item in call.items):
                gone += [item for item in call.items if doomed(item)]
                call.items = deque(item for item in call.items if not doomed(item))
        self._count -= len(gone)
        self._calls = {k: q for k, q in self._calls.items() if q.items}
        return gone

    def __iter__(self) -> Iterator[Schedulable]:
        return (item for call in self._calls.values() for item in call.items)

    def __len__(self) -> int:
        return self._count

    def _aged(self, calls: list[_CallQueue], now: float) -> list[list[_CallQueue]]:
        """``calls`` by aged level (best first, never past their best priority), each level oldest first."""
        if not calls:
            return []
        best = min(call.priority for call in calls)
        levels: dict[int, list[_CallQueue]] = {}
        for call in calls:
            level = max(best, call.priority - int((now - call.arrival) / self.aging_s))
            levels.setdefault(level, []).append(call)
        return [sorted(levels[level], key=lambda c: (c.arrival, c.order)) for level in sorted(levels)]

    def _pop(self, call: _CallQueue, to: Callable[[Schedulable], None]) -> None:
        to(call.items.popleft())
        self._count -= 1


def _call_of(item: Any) -> Any:
    """The call an item belongs to (its engine handle); an item without one is a call of its own."""
    handle = getattr(item, "handle", None)
    return item if handle is None else handle
