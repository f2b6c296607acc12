"""Admission: one per pool, the input cap, calls per worker, queued tokens; refusals go to the next pool."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from poolgate.gateway.pools.admission import (MIN_QUEUED_TOKENS, REASON_QUEUE_FULL, REASON_WORKERS_BUSY, Admission,
                                              AdmissionLimits)
from poolgate.gateway.pools.fleet import admission_limits
from poolgate.gateway.pools.model_pools import ModelPools
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.shared.config.frozen import GatewayConfig, PoolConfig
from poolgate.shared.domain.errors import InvalidRequest, Overloaded
from poolgate.shared.domain.lanes import Lane
from poolgate.gateway.serving import chars
from poolgate.shared.wire.token_call import TokenCall
from poolgate.shared.wire.messages import ChatInput, PoolingCall, TextPair
from tests.fakes import FakeWorkerClient, fake_model, tokenized, until


def call(*inputs: str, rid: str = "r", priority: int = 0, lane: Lane = "live") -> TokenCall:
    """A call of ``inputs`` tokenized (the fake tokenizer: one token per word, plus CLS and SEP)."""
    return tokenized(PoolingCall(request_id=rid, model="m", inputs=list(inputs) or ["a b"], priority=priority,
                                 lane=lane))


def pool(backend: str = "cpu", n: int = 1, **limits) -> WorkerPool:
    info = dataclasses.replace(fake_model(name="m").info, backend=backend)
    return WorkerPool(info, [FakeWorkerClient(info, address=f"{backend}-{i}") for i in range(n)],
                      limits=AdmissionLimits(**limits))


def test_the_input_cap_is_the_requests_own_400():
    admission = Admission(AdmissionLimits(max_inputs_per_request=2))
    admission.check(2)
    with pytest.raises(InvalidRequest, match="Too many inputs: 3 in one request; the limit is 2."):
        admission.check(3)


def test_the_characters_of_one_input_are_capped_before_any_tokenizing():
    admission = Admission(AdmissionLimits(max_chars_per_input=10))
    admission.check(1, 10)
    with pytest.raises(InvalidRequest, match="An input of 11 characters is too long; the limit is 10 characters "
                                             r"per input \(--max-chars-per-input\)"):
        admission.check(1, 11)
    inputs = ["abc", "x" * 7, TextPair("q" * 4, "d" * 5), [1, 2, 3], ChatInput([{"role": "user", "content": "hey"}])]
    assert [chars(x) for x in inputs] == [3, 7, 9, 0, 3]


def test_queued_tokens_are_counted_in_and_out_and_a_lone_big_job_is_admitted():
    admission = Admission(AdmissionLimits(max_queued_tokens=10), model="m")
    admission.admit(50)  # nothing admitted yet: even a job over the limit runs
    admission.admit(2)  # runs beside the big one (round robin): 2 + 2 before it is done
    with pytest.raises(Overloaded, match="Model 'm' cannot take this request of 5 tokens now: 12 tokens of work "
                                         r"would run before it is done \(52 tokens queued; the limit is 10\)"):
        admission.admit(5)  # 5 + 5 + 2 > 10
    admission.release(50)
    admission.release(2)
    for _ in range(2):
        admission.admit(5)  # equal jobs: 5, then 5 + 5
    with pytest.raises(Overloaded):
        admission.admit(5)  # 15 > 10
    assert admission.work_before(1) == 3 and admission.work_before(20) == 30
    assert admission.refused == {(REASON_QUEUE_FULL, "live"): 2} and (admission.tokens, admission.jobs) == (10, 2)
    assert admission.admitted == {"live": 4} and admission.admitted_tokens == {"live": 62}


def test_admitted_bulk_jobs_never_refuse_or_delay_a_live_job():
    admission = Admission(AdmissionLimits(max_queued_tokens=10), model="m")
    admission.admit(500, lane="bulk")  # nothing admitted: a lone bulk job over the limit runs
    with pytest.raises(Overloaded, match="bulk request of 6 tokens now: 12 tokens"):
        admission.admit(6, lane="bulk")  # 6 + 6 of the big one, round robin: over the limit
    assert admission.work_before(4) == 4  # a live job waits for no bulk job
    admission.admit(8)  # live: as if nothing were admitted (50x the limit is queued in bulk)
    admission.admit(2)  # 2 + 2 before it: the live jobs alone count
    with pytest.raises(Overloaded, match=r"request of 8 tokens now: 18 tokens of work .* \(10 tokens queued"):
        admission.admit(8)  # 8 + 8 + 2 > 10: live work is still bounded by live work
    assert (admission.tokens, admission.jobs) == (510, 3)
    assert admission.refused == {(REASON_QUEUE_FULL, "bulk"): 1, (REASON_QUEUE_FULL, "live"): 1}
    assert admission.admitted == {"live": 2, "bulk": 1} and admission.admitted_tokens == {"live": 10, "bulk": 500}
    admission.release(8)
    admission.release(2)
    admission.admit(20)  # no live job admitted: a lone live job over the limit runs beside the bulk one


def test_a_bulk_job_is_refused_when_the_live_and_bulk_work_before_it_passes_the_limit():
    admission = Admission(AdmissionLimits(max_queued_s=1.0), model="m")
    admission.admit(3_000, 5_000.0)  # live; the limit is 5,000 tokens (1 s at 5,000 tokens/s)
    admission.admit(1_000, 5_000.0, lane="bulk")  # 3,000 live + its own 1,000
    assert admission.work_before(1_500, "bulk") == 3_000 + 1_500 + 1_000
    with pytest.raises(Overloaded, match="bulk request of 1500 tokens now: 5500 tokens") as refused:
        admission.admit(1_500, 5_000.0, lane="bulk")
    assert refused.value.reason == REASON_QUEUE_FULL and refused.value.retry_after_s == 1.0
    admission.admit(1_500, 5_000.0)  # a live job of the same size: the bulk one is not counted
    admission.release(3_000)
    admission.release(1_500)
    admission.admit(1_500, 5_000.0, lane="bulk")  # 1,500 + 1,000: the live work is done
    admission.release(1_000, "bulk")
    admission.release(1_500, "bulk")
    assert (admission.tokens, admission.jobs) == (0, 0)
    admission.admit(20_000, 5_000.0, lane="bulk")  # a lone bulk job still runs, or it never could


async def test_a_pools_worker_slots_are_live_first_bulk_takes_one_only_below_the_cap_counting_all():
    busy = pool(max_calls_per_worker=2)
    client = busy.clients[0]
    client.gate = asyncio.Event()
    jobs = [asyncio.create_task(busy.submit(call(rid=f"job{i}", lane="bulk"))) for i in range(2)]
    await until(lambda: len(client.calls) == 2)
    with pytest.raises(Overloaded, match="is busy"):
        await busy.submit(call(rid="job2", lane="bulk"))  # 2 calls in flight: no slot for more bulk
    live = [asyncio.create_task(busy.submit(call(rid=f"q{i}"))) for i in range(2)]  # live counts live calls
    await until(lambda: len(client.calls) == 4)
    with pytest.raises(Overloaded, match="is busy"):
        await busy.submit(call(rid="q2"))  # two live calls: the live cap
    assert busy.member(client).bulk_calls == 2 and busy.in_flight(client) == 4
    client.gate.set()
    await asyncio.gather(*jobs, *live)
    member = busy.member(client)
    assert (member.calls, member.tokens, member.bulk_calls, member.bulk_tokens) == (0, 0, 0, 0)
    assert (busy.admission.tokens, busy.admission.jobs) == (0, 0)


async def test_a_live_job_goes_to_the_worker_with_the_least_live_work_a_bulk_job_to_the_least_work():
    two = pool(n=2)
    first, second = two.clients
    for client in two.clients:
        client.gate = asyncio.Event()
    job = asyncio.create_task(two.submit(call("x " * 50, rid="job", lane="bulk")))  # 52 tokens, on first
    await until(lambda: first.calls)
    small = asyncio.create_task(two.submit(call("y", rid="small")))  # 3 live tokens: second has less in all
    await until(lambda: second.calls)
    live = asyncio.create_task(two.submit(call("z " * 10, rid="live")))  # first has no live work
    bulk = asyncio.create_task(two.submit(call("w", rid="more", lane="bulk")))  # second has less work in all
    await until(lambda: len(first.calls) + len(second.calls) == 4)
    assert [c.request_id for c in first.calls] == ["job", "live"]
    assert [c.request_id for c in second.calls] == ["small", "more"]
    assert [c.lane for c in first.calls] == ["bulk", "live"]
    for client in two.clients:
        client.gate.set()
    await asyncio.gather(job, small, live, bulk)


@pytest.mark.parametrize("limits", [{"max_inputs_per_request": 0}, {"max_calls_per_worker": 0},
                                    {"max_queued_tokens": -1}])
def test_limits_below_one_are_refused(limits):
    with pytest.raises(ValueError, match="must be >= 1"):
        AdmissionLimits(**limits)


def test_a_pools_limits_come_from_the_gateway_and_its_own_table():
    config = GatewayConfig(max_inputs_per_request=7, max_in_flight_per_worker=3)
    assert admission_limits(config, PoolConfig(model="m")) == AdmissionLimits(
        max_inputs_per_request=7, max_chars_per_input=1_000_000, max_calls_per_worker=3, max_queued_s=5.0)
    assert admission_limits(config, PoolConfig(model="m", max_in_flight_per_worker=9)).max_calls_per_worker == 9
    off = GatewayConfig(max_queued_s=None, max_queued_tokens=100)
    limits = admission_limits(off, PoolConfig(model="m"))
    assert (limits.max_queued_tokens, limits.max_queued_s, limits.max_calls_per_worker) == (100, None, None)


async def test_a_pool_over_its_queued_tokens_refuses_and_the_next_pool_takes_the_call():
    first, second = pool("cuda", max_queued_tokens=8), pool("cpu")
    first.clients[0].gate = asyncio.Event()
    model = ModelPools([first, second])
    held = asyncio.create_task(model.submit(call("x " * 5, rid="held")))  # 7 tokens
    await until(lambda: first.clients[0].calls)
    await model.submit(call("y " * 5, rid="over"))  # 7 + 7 > 8: the cpu pool answers
    assert [c.request_id for c in second.clients[0].calls] == ["over"]
    assert first.admission.refused == {(REASON_QUEUE_FULL, "live"): 1}
    first.clients[0].gate.set()
    await held
    assert (first.admission.tokens, first.admission.jobs) == (0, 0)


async def test_calls_per_worker_is_counted_as_a_refusal_reason():
    busy = pool(max_calls_per_worker=1)
    busy.clients[0].gate = asyncio.Event()
    held = asyncio.create_task(busy.submit(call()))
    await until(lambda: busy.clients[0].calls)
    with pytest.raises(Overloaded, match="is busy"):
        await busy.submit(call())
    assert busy.admission.refused == {(REASON_WORKERS_BUSY, "live"): 1}
    busy.clients[0].gate.set()
    await held


def test_too_many_inputs_is_a_400_before_any_tokenizing():
    first, second = pool("cuda", max_inputs_per_request=2), pool("cpu", max_inputs_per_request=2)
    with pytest.raises(InvalidRequest, match="Too many inputs"):
        ModelPools([first, second]).check(3, 1)


async def test_a_worker_whose_queue_is_full_is_skipped_then_the_next_pool():
    first, second = pool("cuda", n=2), pool("cpu")
    for client in first.clients:
        client.fail = Overloaded("The worker's queue is full")
    model = ModelPools([first, second])
    result = await model.submit(call(rid="x"))
    assert result.prompt_tokens == [4]
    assert [len(c.calls) for c in first.clients] == [1, 1]  # each worker of the first pool asked once
    assert all(first.is_ready(c) for c in first.clients)  # a full queue is not a lost worker
    assert [c.request_id for c in second.clients[0].calls] == ["x"]


async def test_priority_and_deadline_go_to_the_worker_unchanged():
    only = pool()
    await only.submit(dataclasses.replace(call(priority=4), deadline=2e9))
    sent = only.clients[0].calls[-1]
    assert (sent.priority, sent.deadline) == (4, 2e9)


def test_the_limit_is_seconds_of_measured_capacity_and_retry_after_is_the_drain_time():
    admission = Admission(AdmissionLimits(max_queued_s=2.0), model="m")
    assert admission.queue_limit(0.0) is None  # no worker measured its rate yet: no limit
    assert admission.queue_limit(10_000.0) == 20_000
    assert admission.queue_limit(10.0) == MIN_QUEUED_TOKENS
    admission.admit(19_000, 10_000.0)
    with pytest.raises(Overloaded) as refused:
        admission.admit(26_000, 10_000.0)  # 25,000 tokens over the limit drain in 2.5 s -> 3
    assert refused.value.retry_after_s == 3.0 and refused.value.reason == REASON_QUEUE_FULL
    admission.admit(1_000, 10_000.0)  # a small job runs beside the big one: 2,000 before it is done
    assert Admission(AdmissionLimits(max_queued_tokens=10, max_queued_s=2.0)).queue_limit(1e6) == 10


async def test_a_pool_reads_its_capacity_from_health_answers_and_refuses_past_it():
    only = pool(max_queued_s=1.0)
    client = only.clients[0]
    client.health_answer = {"ready": True, "pipeline": {"tokens_per_s": 5000.0}}
    await only.probe(1.0)
    assert only.capacity() == 5000.0 and only.snapshot()[0]["tokens_per_s"] == 5000.0
    client.gate = asyncio.Event()
    held = asyncio.create_task(only.submit(call("x " * 4_000)))  # 4,002 tokens admitted
    await until(lambda: client.calls)
    with pytest.raises(Overloaded) as refused:
        await only.submit(call("y " * 5_000))  # 5,002 + 4,002 > max(4096, 5000)
    assert refused.value.retry_after_s == 1.0
    client.health_answer = {"ready": True}  # an answer without a rate keeps the last one
    await only.probe(1.0)
    assert only.capacity() == 5000.0
    client.gate.set()
    await held


async def test_a_pool_admits_by_the_tokens_the_models_tokenizer_counted():
    only = pool(max_queued_tokens=5_000)
    client = only.clients[0]
    text = "w " * 2_000  # 4,000 characters, 2,002 tokens counted (one per word): no characters/4 guess
    assert len(call(text).ids) == 2_002
    client.gate = asyncio.Event()
    held = asyncio.create_task(only.submit(call(text)))
    await until(lambda: client.calls)
    await_second = asyncio.create_task(only.submit(call(text)))  # 2 x 2,002 = 4,004 <= 5,000
    await until(lambda: len(client.calls) == 2)
    with pytest.raises(Overloaded, match="request of 2002 tokens"):
        await only.submit(call(text))  # 3 x 2,002 = 6,006 > 5,000
    assert only.admission.refused == {(REASON_QUEUE_FULL, "live"): 1} and only.admission.tokens == 4_004
    client.gate.set()
    await asyncio.gather(held, await_second)
    assert only.admission.tokens == 0


def test_each_of_n_gateway_processes_admits_its_share_of_the_shared_limits():
    config = GatewayConfig(gateway_processes=4, max_in_flight_per_worker=10, max_queued_s=6.0)
    limits = admission_limits(config, PoolConfig(model="m"))
    assert (limits.max_calls_per_worker, limits.max_queued_s, limits.max_inputs_per_request) == (2, 1.5, 2048)
    tokens = admission_limits(GatewayConfig(gateway_processes=3, max_queued_tokens=100), PoolConfig(model="m", max_in_flight_per_worker=2))
    assert (tokens.max_queued_tokens, tokens.max_calls_per_worker) == (33, 1)  # never below one call per worker
