"""The gateway's Prometheus metrics: request series recorded here, worker series pulled at each scrape.

Every name is a constant in ``shared.telemetry.names``. Request series (count by
route, model and status; latency; errors by type; prompt tokens; the
worker's queue and inference time; admission rejections) are recorded from
each finished request's ``RequestRecord``: ``GatewayMetrics`` is the
``Recorder`` of ``gateway.telemetry.record``. Worker series live in the worker
processes: each ``GET /metrics`` first asks every worker for its stats over
the transport (the ``health`` op, at most ``WORKER_STATS_TIMEOUT_S``), and
``WorkerCollector`` turns the answers into gauges and histograms labelled by
model, backend and worker, so one scrape of the gateway sees everything. A
worker that does not answer reports ``poolgate_worker_up 0`` and nothing else.

With ``--gateway-processes N`` (``multiprocess_dir``: the processes' shared
folder, ``gateway.scale_out``) the request series use prometheus-client's
multiprocess mode: each process writes its values to its own mmap'ed files
there, and a scrape of any process reads every process's files
(``MultiProcessCollector``), so counters and histograms are the sums over the
processes, those of processes that exited included. The worker series are
pulled by the process that answers the scrape alone, so each worker is counted
once. ``poolgate_requests_in_flight`` (calls each process has sent and not had
answered) is a ``livesum`` gauge: each process writes its own every
``PUBLISH_INTERVAL_S`` and at its scrapes, a process that exited drops out.

Each pool's admission (queued tokens and seconds behind, capacity, jobs
admitted and refused: the autoscaling signals) is published the same way, by
``gateway.telemetry.pool_series``: before each scrape, and with N processes by
each process every ``PUBLISH_INTERVAL_S``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from poolgate.gateway.dialects.route import Route, mount
from poolgate.gateway.pools.member import Client
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.gateway.telemetry.pool_series import PoolSeries
from poolgate.gateway.telemetry.record import RequestRecord
from poolgate.shared.domain.errors import PoolgateError
from poolgate.shared.telemetry import names
from poolgate.shared.telemetry.histogram import Histogram as Counts
from poolgate.shared.wire.transport import parse_address

WORKER_STATS_TIMEOUT_S = 1.0
PUBLISH_INTERVAL_S = 1.0  # multiprocess: how often each process writes its calls in flight
IN_FLIGHT_HELP = "Calls sent to the model's workers and not yet answered."
NO_MODEL = "none"  # the model label of a request that never reached a model (bad body, unknown model)
WORKER_LABELS = [names.MODEL, names.BACKEND, names.WORKER]


def worker_label(address: str) -> str:
    """A stable worker name: the socket file for local Unix workers, host:port for TCP ones."""
    try:
        addr = parse_address(address)
    except ValueError:
        return address
    return PurePath(addr.path or "").name if addr.kind == "unix" else f"{addr.host}:{addr.port}"


# the worker's ``health`` answer key -> (metric name, help), one gauge each
LOAD_GAUGES: dict[str, tuple[str, str]] = {
    "requests_running": (names.REQUESTS_RUNNING, "Calls with a batch on the device."),
    "requests_waiting": (names.REQUESTS_WAITING, "Calls queued, no batch started yet."),
    "running": (names.SEQUENCES_RUNNING, "Sequences in the batch on the device."),
    "queued": (names.SEQUENCES_WAITING, "Sequences queued for a batch."),
    "queued_tokens": (names.TOKENS_WAITING, "Tokens queued for a batch."),
}
# the worker's embedding cache stats key (workers.engine.cache) -> (family, metric name, help)
CACHE_SERIES: dict[str, tuple[type, str, str]] = {
    "hits": (CounterMetricFamily, names.EMBEDDING_CACHE_HITS, "Sequences answered from the embedding cache."),
    "misses": (CounterMetricFamily, names.EMBEDDING_CACHE_MISSES, "Sequences the embedding cache sent to the model."),
    "bytes": (GaugeMetricFamily, names.EMBEDDING_CACHE_BYTES, "Bytes the embedding cache holds."),
}
# the worker's prefix cache stats key (workers.engine.prefix_cache) -> (family, metric name, help)
PREFIX_CACHE_SERIES: dict[str, tuple[type, str, str]] = {
    "looked_up_tokens": (
        CounterMetricFamily,
        names.PREFIX_CACHE_LOOKED_UP,
        "Tokens of sequences the prefix cache looked up (causal, LAST-pooled).",
    ),
    "hit_tokens": (CounterMetricFamily, names.PREFIX_CACHE_HITS, "Tokens whose keys and values came from the cache."),
    "shared_tokens": (
        CounterMetricFamily,
        names.PREFIX_CACHE_SHARED,
        "Tokens of a prefix shared within a batch, computed once for it.",
    ),
    "bytes": (GaugeMetricFamily, names.PREFIX_CACHE_BYTES, "Bytes of keys and values the prefix cache holds."),
}
# the worker's pipeline stats scalars (workers.engine.stats) -> (family, metric name, help)
PIPELINE_SERIES: dict[str, tuple[type, str, str]] = {
    "out_of_memory": (
        CounterMetricFamily,
        names.DEVICE_OUT_OF_MEMORY,
        "Batches that ran out of device memory and were split and run again.",
    ),
    "tokens_per_s": (
        GaugeMetricFamily,
        names.WORKER_TOKENS_PER_S,
        "The worker's measured capacity: tokens per second of device time (admission reads it).",
    ),
}
# the worker's pipeline stats key -> (metric name, help), one histogram each
BATCH_HISTOGRAMS: dict[str, tuple[str, str]] = {
    "batch_size": (names.BATCH_SIZE, "Sequences per batch."),
    "batch_tokens": (names.BATCH_TOKENS, "Tokens per batch."),
    "batch_fill": (names.BATCH_FILL, "Batch tokens over the token budget."),
}


@dataclass
class _WorkerSample:
    pool: WorkerPool
    client: Client
    health: dict[str, Any] | None  # None: the worker did not answer


class WorkerCollector:
    """Worker series from the last ``refresh``: up, recoveries, queue, batch shapes, device memory."""

    def __init__(self, router: Router, *, in_flight: bool = True):
        self.router, self.with_in_flight = router, in_flight
        self.samples: list[_WorkerSample] = []

    async def refresh(self) -> None:
        pairs = [(pool, client) for pool in list(self.router.worker_pools()) for client in pool.clients]
        answers = await asyncio.gather(*(_health(client) for _, client in pairs))
        self.samples = [
            _WorkerSample(pool, client, health) for (pool, client), health in zip(pairs, answers, strict=True)
        ]

    def describe(self) -> list[Metric]:
        return []  # collected only at scrape time, after refresh

    def collect(self) -> Iterator[Metric]:
        gauges = {key: GaugeMetricFamily(name, doc, labels=WORKER_LABELS) for key, (name, doc) in LOAD_GAUGES.items()}
        batches = {
            key: HistogramMetricFamily(name, doc, labels=WORKER_LABELS) for key, (name, doc) in BATCH_HISTOGRAMS.items()
        }
        up = GaugeMetricFamily(names.WORKER_UP, "1 if the worker answers and is in rotation.", labels=WORKER_LABELS)
        recoveries = CounterMetricFamily(
            names.WORKER_RECOVERIES, "Times the worker came back into rotation.", labels=WORKER_LABELS
        )
        memory = GaugeMetricFamily(
            names.DEVICE_MEMORY, "Device memory of the worker's model.", labels=[*WORKER_LABELS, "kind"]
        )
        cache = {key: kind(name, doc, labels=WORKER_LABELS) for key, (kind, name, doc) in CACHE_SERIES.items()}
        prefix = {key: kind(name, doc, labels=WORKER_LABELS) for key, (kind, name, doc) in PREFIX_CACHE_SERIES.items()}
        scalars = {key: kind(name, doc, labels=WORKER_LABELS) for key, (kind, name, doc) in PIPELINE_SERIES.items()}
        for s in self.samples:
            labels = [s.pool.name, s.pool.info.backend, worker_label(s.client.address)]
            up.add_metric(labels, 1.0 if s.health is not None and s.pool.is_ready(s.client) else 0.0)
            recoveries.add_metric(labels, s.pool.recoveries(s.client))
            if s.health is None:
                continue
            for key, family in gauges.items():
                family.add_metric(labels, float(s.health.get(key, 0)))
            for kind, value in (s.health.get("device_memory") or {}).items():
                memory.add_metric([*labels, kind], float(value))
            for key, family in cache.items():  # only workers whose model has the cache on
                if key in (s.health.get("cache") or {}):
                    family.add_metric(labels, float(s.health["cache"][key]))
            for key, family in prefix.items():  # only workers whose model has a prefix cache
                if key in (s.health.get("prefix_cache") or {}):
                    family.add_metric(labels, float(s.health["prefix_cache"][key]))
            pipeline = s.health.get("pipeline") or {}
            for key, family in scalars.items():
                if key in pipeline:
                    family.add_metric(labels, float(pipeline[key]))
            for key, histogram in batches.items():
                if key in pipeline:
                    counts = Counts.from_wire(pipeline[key])
                    histogram.add_metric(labels, counts.cumulative(), counts.total)
        yield from (
            up,
            recoveries,
            *gauges.values(),
            memory,
            *batches.values(),
            *cache.values(),
            *prefix.values(),
            *scalars.values(),
        )
        if self.with_in_flight:
            fam = GaugeMetricFamily(names.REQUESTS_IN_FLIGHT, IN_FLIGHT_HELP, labels=[names.MODEL])
            for model, calls in in_flight_calls(self.router).items():
                fam.add_metric([model], float(calls))
            yield fam


def in_flight_calls(router: Router) -> dict[str, int]:
    """Calls this process sent to each model's workers and has not had answered."""
    return {pool.name: sum(pool.in_flight(c) for c in pool.clients) for pool in list(router.pools.values())}


def use_multiprocess(folder: Path) -> None:
    """Switch prometheus-client to its multiprocess mode in this process, before any series is made: values in
    mmap'ed files in ``folder``. The library finds the folder in the variable it reads itself."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    if not getattr(values.ValueClass, "_multiprocess", False):  # a sibling inherits the variable: on at import
        values.ValueClass = values.MultiProcessValue()


async def _health(client: Client) -> dict[str, Any] | None:
    try:
        return await asyncio.wait_for(client.health(), WORKER_STATS_TIMEOUT_S)
    except (TimeoutError, PoolgateError):  # lost, wedged or answering with an error: down
        return None


class Pulled(Protocol):
    """A collector whose series are read fresh at each scrape (``refresh`` first, then ``collect``)."""

    async def refresh(self) -> None: ...

    def describe(self) -> list[Metric]: ...

    def collect(self) -> Iterator[Metric]: ...


class GatewayMetrics:
    """One registry: the request series, and the workers' series through ``WorkerCollector``; with
    ``multiprocess_dir``, the request series of every gateway process (module doc)."""

    def __init__(self, router: Router, multiprocess_dir: Path | None = None):
        disable_created_metrics()  # no *_created series: they only double what a scrape stores
        self.registry = CollectorRegistry()
        self.multiprocess = multiprocess_dir is not None
        if multiprocess_dir is not None:
            use_multiprocess(multiprocess_dir)
            MultiProcessCollector(self.registry, path=str(multiprocess_dir))
        # multiprocess: the series live in the folder's files, read by the collector, not in the registry
        r = None if self.multiprocess else self.registry
        lat, tok = names.LATENCY_BUCKETS, names.TOKEN_BUCKETS
        self.requests = Counter(
            names.REQUESTS,
            "API requests by route, model, HTTP status (a gRPC call's status as its HTTP equivalent) and protocol.",
            [names.ROUTE, names.MODEL, names.STATUS, names.PROTOCOL],
            registry=r,
        )
        self.duration = Histogram(
            names.REQUEST_DURATION,
            "Arrival until the response is written.",
            [names.ROUTE, names.MODEL, names.PROTOCOL],
            buckets=lat,
            registry=r,
        )
        self.errors = Counter(
            names.REQUEST_ERRORS,
            "Failed API requests by error type.",
            [names.ROUTE, names.MODEL, names.ERROR_TYPE],
            registry=r,
        )
        self.prompt_tokens = Counter(
            names.PROMPT_TOKENS, "Prompt tokens pooled.", [names.MODEL, names.TASK], registry=r
        )
        self.request_tokens = Histogram(
            names.REQUEST_PROMPT_TOKENS,
            "Prompt tokens per request.",
            [names.MODEL, names.TASK],
            buckets=tok,
            registry=r,
        )
        self.queue = Histogram(
            names.QUEUE_TIME,
            "Time a request's inputs waited in the worker's queue.",
            [names.MODEL, names.TASK, names.BACKEND],
            buckets=lat,
            registry=r,
        )
        self.inference = Histogram(
            names.INFERENCE_TIME,
            "First batch start until the request's last output.",
            [names.MODEL, names.TASK, names.BACKEND],
            buckets=lat,
            registry=r,
        )
        self.rejections = Counter(
            names.ADMISSION_REJECTIONS,
            "Requests refused with 429 by admission control.",
            [names.MODEL, names.REASON],
            registry=r,
        )
        self.tenant_requests = Counter(
            names.TENANT_REQUESTS,
            "API requests by tenant, model and HTTP status.",
            [names.TENANT, names.MODEL, names.STATUS],
            registry=r,
        )
        self.tenant_tokens = Counter(
            names.TENANT_PROMPT_TOKENS, "Prompt tokens pooled per tenant.", [names.TENANT, names.MODEL], registry=r
        )
        self.media = Counter(
            names.MEDIA_ITEMS, "Images and audio clips in requests, by kind.", [names.MODEL, names.KIND], registry=r
        )
        self.in_flight = Gauge(
            names.REQUESTS_IN_FLIGHT, IN_FLIGHT_HELP, [names.MODEL], registry=None, multiprocess_mode="livesum"
        )
        self.pools = PoolSeries(router, r, multiprocess=self.multiprocess)
        self.workers = WorkerCollector(router, in_flight=not self.multiprocess)
        self.registry.register(self.workers)
        self.pulled: list[Pulled] = [self.workers]

    def add_pulled(self, collector: Pulled) -> None:
        """Serve ``collector``'s series too, refreshed before each scrape (the Batch API's, from its store)."""
        self.registry.register(collector)
        self.pulled.append(collector)

    def observe(self, record: RequestRecord) -> None:
        model = record.model or NO_MODEL
        self.requests.labels(record.route, model, str(record.status), record.protocol).inc()
        self.duration.labels(record.route, model, record.protocol).observe(record.duration_s)
        if record.error_type is not None:
            self.errors.labels(record.route, model, record.error_type).inc()
            if record.status == 429:
                self.rejections.labels(model, record.reason or record.error_type).inc()
        if record.tenant is not None:
            self.tenant_requests.labels(record.tenant, model, str(record.status)).inc()
            if record.prompt_tokens is not None:
                self.tenant_tokens.labels(record.tenant, model).inc(record.prompt_tokens)
        for kind, n in record.media.items():
            self.media.labels(model, kind).inc(n)
        if record.prompt_tokens is not None and record.task is not None:
            self.prompt_tokens.labels(model, record.task).inc(record.prompt_tokens)
            self.request_tokens.labels(model, record.task).observe(record.prompt_tokens)
        if record.queue_s is not None and record.task is not None:
            self.queue.labels(model, record.task, record.backend).observe(record.queue_s)
        if record.inference_s is not None and record.task is not None:
            self.inference.labels(model, record.task, record.backend).observe(record.inference_s)

    async def render(self) -> bytes:
        """The exposition text, with fresh worker stats (and every other pulled collector's series)."""
        await asyncio.gather(*(collector.refresh() for collector in self.pulled))
        self.publish()
        return generate_latest(self.registry)

    def publish(self) -> None:
        """Write this process's own state: the pools' admission series, and (multiprocess) its calls in flight."""
        self.pools.publish()
        if self.multiprocess:
            self.publish_in_flight()

    def publish_in_flight(self) -> None:
        """Write this process's calls in flight per model to its file (multiprocess: summed over the processes
        alive at each scrape)."""
        for model, calls in in_flight_calls(self.workers.router).items():
            self.in_flight.labels(model).set(calls)

    async def keep_publishing(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx (multiprocess): ``publish`` every ``PUBLISH_INTERVAL_S``."""

        async def publish() -> None:
            while True:
                self.publish()
                await asyncio.sleep(PUBLISH_INTERVAL_S)

        task = asyncio.create_task(publish())
        yield
        task.cancel()

    def add_route(self, app: web.Application) -> None:
        """``GET /metrics`` on ``app`` (the API app, or a metrics-only app on its own port): public, not recorded."""

        async def scrape(request: web.Request, _body: None = None) -> web.Response:
            return web.Response(body=await self.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

        mount(app, Route("GET", "/metrics", scrape, summary="Prometheus metrics", public=True, recorded=False))
