"""TokenBudgetScheduler: FIFO batches by token budget, the policy object, the queue bound, cancellation, blocking, close."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from poolgate.shared.domain.errors import Overloaded, Unavailable
from poolgate.workers.engine.policy import BatchCut, FifoPolicy
from poolgate.workers.engine.scheduler import TokenBudgetScheduler


@dataclass(eq=False)
class Item:
    name: str
    num_tokens: int
    cancelled: bool = False
    lane: str = "live"


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


def test_the_queue_bound_refuses_a_call_whole_unless_the_queue_is_empty():
    s = TokenBudgetScheduler(10, max_queued_tokens=8)
    s.add_all([Item("big", 20)])  # an empty queue takes even a call over the bound
    with pytest.raises(Overloaded, match="queue is full"):
        s.add_all([Item("a", 1)])
    assert names(s.next_batch(0)) == ["big"]
    s.add_all([Item("a", 3), Item("b", 3)])
    with pytest.raises(Overloaded):
        s.add_all([Item("c", 1), Item("d", 2)])  # 6 + 3 > 8: neither c nor d is queued
    s.add_all([Item("e", 2)])  # 6 + 2 fits exactly
    assert s.queued == 3 and s.queued_tokens == 8
    assert names(s.next_batch(0)) == ["a", "b", "e"]


def test_queued_bulk_work_never_refuses_a_live_call_and_bulk_is_bounded_by_all_of_it():
    s = TokenBudgetScheduler(10, max_queued_tokens=8)
    s.add_all([Item("job", 20, lane="bulk")])  # an empty queue takes even a bulk call over the bound
    with pytest.raises(Overloaded, match="20 tokens queued, the limit is 8"):
        s.add_all([Item("more", 1, lane="bulk")])
    s.add_all([Item("a", 5), Item("b", 3)])  # live: the bulk tokens are not counted, 8 fits exactly
    with pytest.raises(Overloaded, match="8 tokens queued"):
        s.add_all([Item("c", 1)])  # but live work is still bounded by live work
    assert s.queued_tokens == 28
    assert names(s.next_batch(0)) == ["a", "b"]  # live first (FIFO, bulk last)
    s.add_all([Item("d", 8)])
    assert names(s.next_batch(0)) == ["d"] and names(s.next_batch(0)) == ["job"]
    s.add_all([Item("x", 5, lane="bulk")])
    s.add_all([Item("y", 3, lane="bulk")])  # 5 + 3 fits the bound exactly
    with pytest.raises(Overloaded):
        s.add_all([Item("z", 1, lane="bulk")])


def test_fifo_puts_bulk_after_every_live_item_and_never_lets_it_jump_a_live_one():
    s = TokenBudgetScheduler(10)
    for item in (Item("j1", 4, lane="bulk"), Item("a", 4), Item("j2", 1, lane="bulk"), Item("b", 1)):
        s.add(item)
    assert names(s.next_batch(0)) == ["a", "b", "j1", "j2"]
    for item in (Item("j3", 1, lane="bulk"), Item("c", 8), Item("d", 4)):
        s.add(item)
    assert names(s.next_batch(0)) == ["c"]  # d does not fit: the batch ends, j3 does not jump it
    assert names(s.next_batch(0)) == ["d", "j3"]
    j4 = Item("j4", 1, lane="bulk")
    s.add(j4)
    j4.cancelled = True
    assert s.queued == 0 and s.next_batch(0) == []


def test_cancelled_items_make_room_under_the_bound():
    s = TokenBudgetScheduler(10, max_queued_tokens=4)
    a = Item("a", 4)
    s.add(a)
    a.cancelled = True
    s.add(Item("b", 4))
    assert names(s.next_batch(0)) == ["b"]


def test_fifo_is_the_default_policy_and_a_given_one_is_used():
    class ShortestFirst(FifoPolicy):
        def cut(self, batch):
            for item in sorted(self._queue, key=lambda i: i.num_tokens):
                if not batch.fits(item):
                    break
                self._queue.remove(item)
                batch.take(item)

    s = TokenBudgetScheduler(5, policy=ShortestFirst())
    for name, n in [("long", 4), ("short", 1), ("mid", 2)]:
        s.add(Item(name, n))
    assert names(s.next_batch(0)) == ["short", "mid"]
    assert names(s.next_batch(0)) == ["long"]


def test_a_batch_cut_is_always_true_for_its_first_item_and_padded_costs_count_times_longest():
    cut = BatchCut(6, padded=True)
    assert cut.fits(Item("huge", 100))
    cut = BatchCut(6, padded=True)
    cut.take(Item("a", 1))
    assert cut.fits(Item("b", 3))  # 2 x 3 = 6
    cut.take(Item("b", 3))
    assert not cut.fits(Item("c", 1))  # 3 x 3 = 9 > 6


def test_a_full_queue_says_when_it_will_have_room_at_the_measured_rate():
    s = TokenBudgetScheduler(10, max_queued_tokens=1000)
    s.add_all([Item("a", 900)])
    with pytest.raises(Overloaded) as before:
        s.add_all([Item("b", 300)])
    assert before.value.reason == "queue_full" and before.value.retry_after_s is None  # no rate measured yet
    s.tokens_per_s = 40.0
    with pytest.raises(Overloaded) as refused:
        s.add_all([Item("b", 300)])  # 200 tokens over the bound: 5 s at 40 tokens/s
    assert refused.value.retry_after_s == 5.0
    s.tokens_per_s = 1.0
    with pytest.raises(Overloaded) as slow:
        s.add_all([Item("b", 300)])
    assert slow.value.retry_after_s == 60.0  # capped, as a tenant's Retry-After is


def test_a_batch_is_cut_early_only_for_a_full_budget_of_live_work():
    s = TokenBudgetScheduler(8)
    executing = [True]
    s.add(Item("job", 8, lane="bulk"))  # a full budget, all bulk: it waits for the running batch to end
    assert s.next_batch(0.05, hold=lambda: executing[0]) == []
    s.add(Item("live", 4))  # half a budget of live work: still waits
    assert s.next_batch(0.05, hold=lambda: executing[0]) == []
    s.add(Item("more", 4))  # a full budget of live work is cut early, bulk left for later
    assert names(s.next_batch(0.05, hold=lambda: executing[0])) == ["live", "more"]
    executing[0] = False  # the device is free: bulk alone goes
    assert names(s.next_batch(0.05, hold=lambda: executing[0])) == ["job"]
