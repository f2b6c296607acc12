"""TokenBudgetScheduler: FIFO batches by token budget, cancellation, blocking, close."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from poolgate.shared.errors import Unavailable
from poolgate.workers.engine.scheduler import TokenBudgetScheduler


@dataclass(eq=False)
class Item:
    name: str
    num_tokens: int
    cancelled: bool = False


def names(batch):
    return [item.name for item in batch]


def test_fifo_up_to_the_budget():
    s = TokenBudgetScheduler(10)
    for name, n in [("a", 4), ("b", 4), ("c", 4), ("d", 1)]:
        s.add(Item(name, n))
    # c does not fit after a+b; d would, but FIFO never lets it jump ahead.
    assert names(s.next_batch(0)) == ["a", "b"]
    assert names(s.next_batch(0)) == ["c", "d"]
    assert s.next_batch(0) == []


def test_exact_budget_fits():
    s = TokenBudgetScheduler(8)
    s.add(Item("a", 5))
    s.add(Item("b", 3))
    assert names(s.next_batch(0)) == ["a", "b"]


def test_oversize_item_goes_alone():
    s = TokenBudgetScheduler(10)
    s.add(Item("big", 50))
    s.add(Item("small", 1))
    assert names(s.next_batch(0)) == ["big"]
    assert names(s.next_batch(0)) == ["small"]


def test_cancelled_items_are_never_returned():
    s = TokenBudgetScheduler(10)
    a, b, c = Item("a", 6), Item("b", 6), Item("c", 4)
    for item in (a, b, c):
        s.add(item)
    a.cancelled = True
    b.cancelled = True
    assert names(s.next_batch(0)) == ["c"]


def test_cancelled_items_do_not_count_as_load():
    s = TokenBudgetScheduler(10)
    a, b = Item("a", 6), Item("b", 3)
    s.add(a)
    s.add(b)
    assert (s.queued, s.queued_tokens) == (2, 9)
    a.cancelled = True
    assert (s.queued, s.queued_tokens) == (1, 3)
    assert names(s.next_batch(0)) == ["b"]
    assert (s.queued, s.queued_tokens) == (0, 0)


def test_only_cancelled_items_queued_times_out_empty():
    s = TokenBudgetScheduler(10)
    item = Item("a", 1)
    s.add(item)
    item.cancelled = True
    assert s.next_batch(timeout=0.05) == []


def test_timeout_returns_empty():
    s = TokenBudgetScheduler(10)
    start = time.monotonic()
    assert s.next_batch(timeout=0.05) == []
    assert 0.04 <= time.monotonic() - start < 1.0


def test_blocks_until_another_thread_adds():
    s = TokenBudgetScheduler(10)
    got = []
    waiter = threading.Thread(target=lambda: got.append(s.next_batch(timeout=5)))
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()  # still waiting: nothing queued yet
    s.add(Item("a", 1))
    waiter.join(2)
    assert not waiter.is_alive()
    assert names(got[0]) == ["a"]


def test_concurrent_adds_lose_nothing():
    s = TokenBudgetScheduler(7)
    n_threads, per_thread = 8, 250
    seen = []

    def produce(t):
        for i in range(per_thread):
            s.add(Item(f"{t}-{i}", 1 + i % 5))

    def consume():
        while len(seen) < n_threads * per_thread:
            batch = s.next_batch(timeout=2)
            assert batch, "consumer starved"
            assert len(batch) == 1 or sum(x.num_tokens for x in batch) <= 7
            seen.extend(batch)

    consumer = threading.Thread(target=consume)
    consumer.start()
    producers = [threading.Thread(target=produce, args=(t,)) for t in range(n_threads)]
    for p in producers:
        p.start()
    for p in producers:
        p.join()
    consumer.join(10)
    assert len({x.name for x in seen}) == n_threads * per_thread
    for t in range(n_threads):  # each producer's items come out in its own order
        mine = [int(x.name.split("-")[1]) for x in seen if x.name.startswith(f"{t}-")]
        assert mine == sorted(mine)
    assert s.queued == 0 and s.queued_tokens == 0


def test_close_wakes_waiters_and_returns_leftovers():
    s = TokenBudgetScheduler(10)
    results = []
    waiters = [threading.Thread(target=lambda: results.append(s.next_batch())) for _ in range(3)]
    for w in waiters:
        w.start()
    time.sleep(0.05)
    assert s.close() == []
    for w in waiters:
        w.join(2)
        assert not w.is_alive()
    assert results == [[], [], []]
    assert s.closed


def test_close_hands_back_queued_items_and_refuses_new_ones():
    s = TokenBudgetScheduler(10)
    a, b = Item("a", 1), Item("b", 1)
    s.add(a)
    s.add(b)
    b.cancelled = True
    assert names(s.close()) == ["a"]
    assert s.next_batch(timeout=0) == []
    with pytest.raises(Unavailable):
        s.add(Item("c", 1))


def test_budget_must_be_positive():
    with pytest.raises(ValueError):
        TokenBudgetScheduler(0)
