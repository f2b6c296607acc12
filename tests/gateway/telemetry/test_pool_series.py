"""Each pool's admission as series (the autoscaling signals): over a real worker, by hand, and across processes."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

from poolgate.gateway.http.state import ROUTER
from poolgate.gateway.pools.admission import AdmissionLimits
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.gateway.telemetry.pool_series import PoolSeries
from poolgate.shared.domain.errors import Overloaded
from poolgate.shared.telemetry import names
from tests.fakes import FakeWorkerClient, fake_model
from tests.gateway.telemetry.scrape import EMBED, samples, value

M = "fake-model"


def pool(backend: str = "cpu", name: str = M, capacity: float = 0.0, **limits) -> WorkerPool:
    """A pool of one fake client whose measured capacity is ``capacity`` tokens/s."""
    info = dataclasses.replace(fake_model(name=name).info, backend=backend)
    made = WorkerPool(info, [FakeWorkerClient(info, address=f"{backend}-0")], limits=AdmissionLimits(**limits))
    made.member(made.clients[0]).tokens_per_s = capacity
    return made


def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_scrape_shows_what_the_pools_admission_holds_and_decided(scraped):
    model = fake_model()
    model.runner.release.clear()  # hold the first batch on the "device"
    client = await scraped(models=[model], max_in_flight=1)
    served = client.app[ROUTER].pools[M].pools[0]
    served.member(served.clients[0]).tokens_per_s = 4.0
    held = asyncio.create_task(client.post(EMBED, json={"input": "x y z"}))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    assert (await client.post(EMBED, json={"input": "y"})).status == 429  # the worker is at its 1 call
    got = await samples(client)
    live = {"model": M, "backend": "cpu", "lane": "live"}
    queued = served.admission.queued("live")
    assert queued == 5  # the fake tokenizer: one token a word, plus CLS and SEP
    assert value(got, names.POOL_QUEUED_TOKENS, **live) == queued
    assert value(got, names.POOL_QUEUED_SECONDS, **live) == queued / 4.0  # seconds behind
    assert value(got, names.POOL_QUEUED_TOKENS, **{**live, "lane": "bulk"}) == 0
    assert value(got, names.POOL_CAPACITY, model=M, backend="cpu") == 4.0
    assert value(got, f"{names.POOL_ADMITTED}_total", **live) == 1
    assert value(got, f"{names.POOL_ADMITTED_TOKENS}_total", **live) == queued
    assert value(got, f"{names.POOL_REFUSED}_total", **live, reason="workers_busy") == 1
    assert value(got, f"{names.POOL_REFUSED}_total", **live, reason="queue_full") == 0  # shown before it counts
    assert value(got, f"{names.ADMISSION_REJECTIONS}_total", model=M, reason="workers_busy") == 1  # the client's 429
    model.runner.release.set()
    assert (await held).status == 200
    got = await samples(client)
    assert value(got, names.POOL_QUEUED_TOKENS, **live) == 0 and value(got, names.POOL_QUEUED_SECONDS, **live) == 0
    assert value(got, f"{names.POOL_ADMITTED}_total", **live) == 1  # counted once, whatever the scrapes


def test_counters_grow_by_what_was_decided_between_publishes_and_lanes_stay_apart():
    cpu = pool(capacity=100.0, max_queued_tokens=10)
    router = Router([cpu])
    registry = CollectorRegistry()
    series = PoolSeries(router, registry)
    labels = {"model": M, "backend": "cpu"}
    series.publish()
    assert value(scrape(registry), f"{names.POOL_ADMITTED}_total", **labels, lane="live") == 0
    cpu.admission.admit(40, 100.0, lane="bulk")  # alone: admitted over the limit
    cpu.admission.admit(8, 100.0)  # live: no bulk work counts against it
    with pytest.raises(Overloaded):
        cpu.admission.admit(8, 100.0)  # 8 + 8 > 10
    series.publish()
    series.publish()  # a second publish adds nothing
    got = scrape(registry)
    assert value(got, f"{names.POOL_ADMITTED}_total", **labels, lane="live") == 1
    assert value(got, f"{names.POOL_ADMITTED_TOKENS}_total", **labels, lane="bulk") == 40
    assert value(got, f"{names.POOL_REFUSED}_total", **labels, lane="live", reason="queue_full") == 1
    assert value(got, names.POOL_QUEUED_SECONDS, **labels, lane="live") == 0.08
    assert value(got, names.POOL_QUEUED_SECONDS, **labels, lane="bulk") == 0.4
    cpu.admission.release(8)
    cpu.admission.admit(2, 100.0)
    series.publish()
    got = scrape(registry)
    assert value(got, f"{names.POOL_ADMITTED}_total", **labels, lane="live") == 2
    assert value(got, names.POOL_QUEUED_TOKENS, **labels, lane="live") == 2


def test_each_pool_has_its_series_and_a_gone_model_leaves_no_gauge():
    cpu, cuda = pool(capacity=10.0), pool("cuda", capacity=30.0)
    other = pool("cuda", name="other")
    router = Router([cpu, cuda, other])
    registry = CollectorRegistry()
    series = PoolSeries(router, registry)
    cpu.admission.admit(20)
    cuda.admission.admit(60)
    other.admission.admit(7)
    series.publish()
    got = scrape(registry)
    for backend, queued, behind in (("cpu", 20, 2.0), ("cuda", 60, 2.0)):
        labels = {"model": M, "backend": backend, "lane": "live"}
        assert value(got, names.POOL_QUEUED_TOKENS, **labels) == queued
        assert value(got, names.POOL_QUEUED_SECONDS, **labels) == behind
    assert value(got, names.POOL_CAPACITY, model=M, backend="cuda") == 30
    gone = {"model": "other", "backend": "cuda", "lane": "live"}
    assert value(got, names.POOL_QUEUED_SECONDS, **gone) == 0  # capacity not measured yet: 0, not a guess
    router.remove("other")
    series.publish()
    got = scrape(registry)
    assert not any(n in (names.POOL_QUEUED_TOKENS, names.POOL_CAPACITY) and ("model", "other") in ls for n, ls in got)
    assert value(got, f"{names.POOL_ADMITTED}_total", **gone) == 1  # a counter stays


def _publish_in_a_process(folder: str, queued: int, capacity: float) -> None:
    """One gateway process of several: admit ``queued`` tokens in its pool and publish (multiprocess mode)."""
    from poolgate.gateway.telemetry.metrics import use_multiprocess

    use_multiprocess(Path(folder))
    mine = pool(capacity=capacity)
    series = PoolSeries(Router([mine]), None, multiprocess=True)
    mine.admission.admit(queued, capacity)
    series.publish()


def test_several_gateway_processes_add_up(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_publish_in_a_process, args=(str(tmp_path), q, c)) for q, c in ((30, 10.0), (50, 12.5))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    got = scrape(registry)
    live = {"model": M, "backend": "cpu", "lane": "live"}
    assert value(got, names.POOL_QUEUED_TOKENS, **live) == 80  # each process admits its own share
    assert value(got, names.POOL_QUEUED_SECONDS, **live) == 3 + 4
    assert value(got, names.POOL_CAPACITY, model=M, backend="cpu") == 12.5  # the same workers: the largest view
    assert value(got, f"{names.POOL_ADMITTED}_total", **live) == 2
    mark_process_dead(procs[0].pid, str(tmp_path))  # what gateway.scale_out does when a process exits
    got = scrape(registry)
    assert value(got, names.POOL_QUEUED_TOKENS, **live) == 50  # a process that exited drops out of the gauges
    assert value(got, f"{names.POOL_ADMITTED}_total", **live) == 2  # and stays in the counters
