"""FairPolicy: priority levels, aging that never overtakes, bulk after every live level, round robin over calls,
the mixed-load budget."""
from __future__ import annotations

import asyncio
import time

import pytest

from poolgate.shared.domain.lanes import Lane
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.engine import Engine
from poolgate.workers.engine.fair_policy import FairPolicy
from poolgate.workers.engine.policy import BatchCut
from poolgate.workers.engine.scheduler import TokenBudgetScheduler
from poolgate.workers.engine.sequence import Sequence
from tests.fakes import fake_model, running_engine


def seqs(name: str, n: int, *, tokens: int = 1, priority: int = 0, waited: float = 0.0,
         lane: Lane = "live") -> list[Sequence]:
    """``n`` sequences of one call named ``name`` (each sequence's first token is its index)."""
    arrival = time.monotonic() - waited
    return [Sequence([i] * tokens, PoolingParams(), arrival=arrival, handle=name, priority=priority, lane=lane)
            for i in range(n)]


def cut(policy: FairPolicy, budget: int) -> list[tuple[str, int]]:
    batch = BatchCut(budget)
    policy.cut(batch)
    return [(s.handle, s.token_ids[0]) for s in batch.items]


def queue(policy: FairPolicy, *calls: list[Sequence]) -> FairPolicy:
    for call in calls:
        for s in call:
            policy.add(s)
    return policy


def test_a_big_call_shares_the_batch_round_robin_with_a_small_one():
    policy = queue(FairPolicy(), seqs("big", 2048), seqs("small", 1, waited=-0.001))
    assert cut(policy, 4) == [("big", 0), ("small", 0), ("big", 1), ("big", 2)]
    assert len(policy) == 2045


def test_a_lower_priority_number_runs_first_and_leftover_budget_goes_to_the_next_lane():
    policy = queue(FairPolicy(), seqs("bulk", 5, priority=10, waited=0.5), seqs("live", 2, priority=0))
    assert cut(policy, 4) == [("live", 0), ("live", 1), ("bulk", 0), ("bulk", 1)]


def test_aging_lifts_a_waiting_call_to_the_best_lane_but_never_past_it():
    policy = queue(FairPolicy(aging_s=1.0), seqs("bulk", 3, priority=10, waited=100.0), seqs("live", 3, priority=0))
    # 100 s of waiting would be level -90: it stops at the best queued (0) and shares that lane, oldest first
    assert cut(policy, 4) == [("bulk", 0), ("live", 0), ("bulk", 1), ("live", 1)]
    young = queue(FairPolicy(aging_s=1.0), seqs("bulk", 2, priority=10, waited=5.0), seqs("live", 2, priority=0))
    assert cut(young, 2) == [("live", 0), ("live", 1)]  # 5 s lifted it to level 5 only


def test_a_bulk_call_queued_long_before_live_calls_never_runs_before_them_however_long_it_waits():
    policy = queue(FairPolicy(aging_s=1.0), seqs("job", 8, priority=-5, waited=10_000.0, lane="bulk"),
                   seqs("late", 3, priority=10), seqs("later", 3, priority=10, waited=-0.001))
    # 10,000 aging periods and a better priority number: still after every live call, even priority 10 ones
    assert cut(policy, 4) == [("late", 0), ("later", 0), ("late", 1), ("later", 1)]
    # then bulk, beside live work at most a quarter of the budget (BULK_BESIDE_LIVE): the batch stays short
    assert cut(policy, 4) == [("late", 2), ("later", 2), ("job", 0)]
    assert cut(policy, 4) == [("job", 1), ("job", 2), ("job", 3), ("job", 4)]  # alone, bulk fills it


def test_a_live_one_input_call_beside_a_2048_input_bulk_call_is_in_the_next_batch():
    policy = queue(FairPolicy(), seqs("job", 2048, waited=5.0, lane="bulk"))
    assert cut(policy, 4) == [("job", 0), ("job", 1), ("job", 2), ("job", 3)]
    queue(policy, seqs("query", 1))
    assert cut(policy, 4) == [("query", 0), ("job", 4)]  # a short batch: a quarter of the budget of bulk beside it
    assert len(policy) == 2048 - 5


def test_bulk_gets_only_the_budget_live_work_leaves():
    policy = queue(FairPolicy(), seqs("job", 10, lane="bulk", waited=1.0), seqs("live", 6, tokens=2))
    assert cut(policy, 8) == [("live", 0), ("live", 1), ("live", 2), ("live", 3)]  # live fills it: no bulk
    assert cut(policy, 8) == [("live", 4), ("live", 5), ("job", 0), ("job", 1)]  # bulk beside live: <= 1/4
    # a live sequence that does not fit is skipped for this batch; bulk may use what is left, never before it
    policy = queue(FairPolicy(), seqs("job", 4, lane="bulk", waited=1.0), seqs("a", 1, tokens=3),
                   seqs("long", 1, tokens=4, waited=-0.001))
    assert cut(policy, 4) == [("a", 0), ("job", 0)]
    assert cut(policy, 4) == [("long", 0)]


def test_a_lone_bulk_call_fills_whole_batches_and_bulk_calls_share_round_robin():
    policy = queue(FairPolicy(), seqs("job", 10, lane="bulk"))
    assert [n for n, _ in cut(policy, 4)] == ["job"] * 4 and [n for n, _ in cut(policy, 4)] == ["job"] * 4
    two = queue(FairPolicy(), seqs("a", 4, lane="bulk", waited=0.001), seqs("b", 4, lane="bulk"))
    assert cut(two, 4) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


def test_bulk_calls_are_ordered_and_aged_by_priority_among_themselves():
    policy = queue(FairPolicy(aging_s=1.0), seqs("low", 2, priority=5, lane="bulk", waited=1.0),
                   seqs("high", 2, priority=0, lane="bulk"))
    assert cut(policy, 2) == [("high", 0), ("high", 1)]
    aged = queue(FairPolicy(aging_s=1.0), seqs("low", 2, priority=5, lane="bulk", waited=100.0),
                 seqs("high", 2, priority=0, lane="bulk"), seqs("live", 1, priority=9))
    # low shares the best bulk level; beside the live call bulk takes a quarter of the budget (4 of 16)
    assert cut(aged, 16) == [("live", 0), ("low", 0), ("high", 0), ("low", 1), ("high", 1)]


def test_a_sequence_that_does_not_fit_is_skipped_for_this_batch_only():
    policy = queue(FairPolicy(), seqs("long", 1, tokens=8), seqs("short", 3, tokens=1, waited=-0.001))
    assert [n for n, _ in cut(policy, 4)] == ["long"]  # the first item always goes, even over budget
    policy = queue(FairPolicy(), seqs("a", 1, tokens=3), seqs("long", 1, tokens=8, waited=-0.001),
                   seqs("b", 1, tokens=1, waited=-0.002))
    assert [n for n, _ in cut(policy, 4)] == ["a", "b"]
    assert [n for n, _ in cut(policy, 4)] == ["long"]


def test_cancelled_sequences_are_dropped_and_removed():
    policy = queue(FairPolicy(), first := seqs("a", 3), seqs("b", 1, waited=-0.001))
    first[0].cancelled = True
    batch = BatchCut(10)
    policy.cut(batch)
    assert [(s.handle, s.token_ids[0]) for s in batch.items] == [("a", 1), ("b", 0), ("a", 2)]
    assert batch.dropped == [first[0]] and len(policy) == 0
    queue(policy, later := seqs("c", 2))
    assert policy.remove(lambda s: s is later[1]) == [later[1]] and list(policy) == [later[0]]


def test_the_budget_is_about_max_batch_s_of_device_time():
    policy = FairPolicy(max_batch_s=0.25, min_batch_tokens=100)
    assert policy.budget(8192, 4000.0) == 1000
    assert policy.budget(8192, 40.0) == 100  # never below min_batch_tokens
    assert policy.budget(8192, 1e6) == 8192 and policy.budget(8192, None) == 8192  # never above; rate unknown


def test_the_scheduler_cuts_with_the_policys_budget():
    s = TokenBudgetScheduler(8, policy=FairPolicy(max_batch_s=1.0, min_batch_tokens=1))
    for call in (seqs("a", 4), seqs("b", 4, waited=-0.001)):
        s.add_all(call)
    s.tokens_per_s = 2.0  # 1 s of device time is 2 tokens
    assert [x.handle for x in s.next_batch(0)] == ["a", "b"]


def test_cancelled_bulk_sequences_are_dropped_like_live_ones():
    policy = queue(FairPolicy(), job := seqs("job", 2, lane="bulk"), seqs("live", 1))
    job[0].cancelled = True
    batch = BatchCut(10)
    policy.cut(batch)
    assert [(s.handle, s.token_ids[0]) for s in batch.items] == [("live", 0), ("job", 1)]
    assert batch.dropped == [job[0]] and len(policy) == 0


@pytest.mark.parametrize("kwargs", [{"aging_s": 0}, {"max_batch_s": -1}, {"min_batch_tokens": 0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        FairPolicy(**kwargs)


async def test_in_the_engine_a_small_call_runs_in_the_next_batch_beside_a_big_one():
    model = fake_model(max_batch_tokens=8)
    engine = Engine(model)
    await engine.start()
    try:
        model.runner.release.clear()
        held = asyncio.create_task(engine.submit(PoolingCall(request_id="h", model="fake-model", inputs=[[1]])))
        await asyncio.to_thread(model.runner.entered.wait, 2)
        big = asyncio.create_task(engine.submit(
            PoolingCall(request_id="big", model="fake-model", inputs=[[100 + i] for i in range(64)])))
        await asyncio.sleep(0.05)
        small = asyncio.create_task(engine.submit(PoolingCall(request_id="s", model="fake-model", inputs=[[7]])))
        await asyncio.sleep(0.05)
        model.runner.release.set()
        await asyncio.gather(held, big, small)
        ran = [[s.token_ids[0] for s in batch] for batch in model.runner.batches]
        small_at = next(i for i, batch in enumerate(ran) if 7 in batch)
        assert small_at <= 2 and len(ran) >= 9  # the big call needs 8 batches; the small one did not wait for them
    finally:
        await engine.stop()


async def test_in_the_engine_a_live_call_runs_in_the_next_batch_beside_a_bulk_job():
    model = fake_model(max_batch_tokens=8)
    async with running_engine(model) as engine:
        model.runner.release.clear()
        held = asyncio.create_task(engine.submit(PoolingCall(request_id="h", model="fake-model", inputs=[[1]])))
        await asyncio.to_thread(model.runner.entered.wait, 2)
        job = asyncio.create_task(engine.submit(PoolingCall(
            request_id="job", model="fake-model", inputs=[[100 + i] for i in range(64)], lane="bulk")))
        await asyncio.sleep(0.05)
        live = asyncio.create_task(engine.submit(
            PoolingCall(request_id="q", model="fake-model", inputs=[[7]], priority=10)))
        await asyncio.sleep(0.05)
        model.runner.release.set()
        await asyncio.gather(held, job, live)
        ran = [[s.token_ids[0] for s in batch] for batch in model.runner.batches]
        live_at = next(i for i, batch in enumerate(ran) if 7 in batch)
        assert live_at <= 2 and len(ran) >= 9  # after at most the batch prepared while the first one ran
        assert {s.lane for s in model.runner.batches[-1]} == {"bulk"}
