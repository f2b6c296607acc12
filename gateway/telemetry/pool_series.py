"""Each pool's admission as series: how far behind it is (queued tokens and seconds), its capacity, jobs in and out.

These are the autoscaling signals (docs/operations.md, "Autoscaling"), one set
per model and pool (label ``backend``), read from the ``Admission`` of each
``WorkerPool`` (``gateway.pools.admission``): what this gateway admitted and
waits on, the same numbers admission decides on, not what the workers report.

- ``poolgate_pool_queued_tokens{model, backend, lane}``: counted tokens of the
  jobs admitted and not yet answered (queued in or running on the workers);
- ``poolgate_pool_capacity_tokens_per_second{model, backend}``: the pool's
  measured capacity, the sum of its ready workers' ``tokens_per_s`` (0 until
  one has measured it);
- ``poolgate_pool_queued_seconds{model, backend, lane}``: queued tokens over
  capacity, the seconds of work the pool is behind: what ``--max-queued-seconds``
  bounds (a live job is refused at about that many). 0 while the capacity is
  not known; the queued tokens still show the load then;
- ``poolgate_pool_admitted_jobs_total`` and ``poolgate_pool_admitted_tokens_total``
  ``{model, backend, lane}``: jobs (and their tokens) the pool admitted; the
  tokens' rate over the capacity is the pool's utilization;
- ``poolgate_pool_refused_jobs_total{model, backend, reason, lane}``: jobs the
  pool refused (``queue_full``, ``workers_busy``). The model's next pool may
  still take them: ``poolgate_admission_rejections_total`` counts the 429s that
  clients saw.

A model has at most one pool per backend (``gateway.pools.model_pools``), so
``model`` and ``backend`` name one pool. ``publish`` writes the series from the pools: before each scrape, and with
``--gateway-processes N`` also every ``PUBLISH_INTERVAL_S`` in each process
(prometheus-client's multiprocess mode, ``gateway.telemetry.metrics``). The
counters grow by what the process admitted since its last publish, so they are
sums over the processes (exited ones included); queued tokens and seconds are
``livesum`` gauges, since each process admits its own share of the work; the
capacity is a ``livemax`` gauge, since every process measures the same workers.
"""

from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from prometheus_client import CollectorRegistry, Counter, Gauge

from poolgate.gateway.pools.admission import REASON_QUEUE_FULL, REASON_WORKERS_BUSY, Admission
from poolgate.gateway.pools.router import Router
from poolgate.shared.domain.lanes import LANES
from poolgate.shared.telemetry import names

POOL_LABELS = [names.MODEL, names.BACKEND]
REASONS = (REASON_QUEUE_FULL, REASON_WORKERS_BUSY)

Key = tuple[str, str]  # (model, backend)


@dataclass
class _Seen:
    """An admission's counts at the last publish."""

    admitted: Tally = field(default_factory=Tally)
    tokens: Tally = field(default_factory=Tally)
    refused: Tally = field(default_factory=Tally)


class PoolSeries:
    """The pools' series (module doc); ``registry`` None in multiprocess mode (the values live in its files)."""

    def __init__(self, router: Router, registry: CollectorRegistry | None, *, multiprocess: bool = False):
        self.router, self.multiprocess = router, multiprocess
        lane = [*POOL_LABELS, names.LANE]
        self.queued_tokens = Gauge(
            names.POOL_QUEUED_TOKENS,
            "Counted tokens of the jobs the pool admitted and has not answered yet.",
            lane,
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.queued_seconds = Gauge(
            names.POOL_QUEUED_SECONDS,
            "Seconds behind: the pool's queued tokens over its measured capacity (0 while not measured).",
            lane,
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.capacity = Gauge(
            names.POOL_CAPACITY,
            "The pool's measured capacity: its ready workers' tokens per second (0 while not measured).",
            POOL_LABELS,
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.admitted = Counter(names.POOL_ADMITTED, "Jobs the pool admitted.", lane, registry=registry)
        self.admitted_tokens = Counter(
            names.POOL_ADMITTED_TOKENS, "Counted tokens of the jobs the pool admitted.", lane, registry=registry
        )
        self.refused = Counter(
            names.POOL_REFUSED,
            "Jobs the pool's admission refused, by reason (the model's next pool may have taken them).",
            [*POOL_LABELS, names.REASON, names.LANE],
            registry=registry,
        )
        self._seen: WeakKeyDictionary[Admission, _Seen] = WeakKeyDictionary()
        self._shown: set[Key] = set()

    def publish(self) -> None:
        """Write every pool's series now (module doc)."""
        shown: set[Key] = set()
        for pool in list(self.router.worker_pools()):
            key = (pool.name, pool.info.backend)
            shown.add(key)
            capacity = pool.capacity()
            self.capacity.labels(*key).set(capacity)
            for lane in LANES:
                queued = pool.admission.queued(lane)
                self.queued_tokens.labels(*key, lane).set(queued)
                self.queued_seconds.labels(*key, lane).set(queued / capacity if capacity > 0 else 0.0)
            self._count(key, pool.admission)
        for key in self._shown - shown:  # a model no longer served
            self._forget(key)
        self._shown = shown

    def _count(self, key: Key, admission: Admission) -> None:
        """Add what ``admission`` decided since the last publish to the counters."""
        seen = self._seen.get(admission)
        if seen is None:  # a new pool: every series of it shows, at 0 until it counts
            seen = self._seen[admission] = _Seen()
            for lane in LANES:
                self.admitted.labels(*key, lane)
                self.admitted_tokens.labels(*key, lane)
                for reason in REASONS:
                    self.refused.labels(*key, reason, lane)
        for lane, jobs in admission.admitted.items():
            self.admitted.labels(*key, lane).inc(jobs - seen.admitted[lane])
            self.admitted_tokens.labels(*key, lane).inc(admission.admitted_tokens[lane] - seen.tokens[lane])
        for (reason, lane), jobs in admission.refused.items():
            self.refused.labels(*key, reason, lane).inc(jobs - seen.refused[reason, lane])
        seen.admitted, seen.tokens, seen.refused = (
            Tally(admission.admitted),
            Tally(admission.admitted_tokens),
            Tally(admission.refused),
        )

    def _forget(self, key: Key) -> None:
        """A pool's gauges once its model is gone: removed (multiprocess mode cannot remove: zeroed)."""
        lane_gauges = (self.queued_tokens, self.queued_seconds)
        labelled = [(self.capacity, key), *((g, (*key, lane)) for g in lane_gauges for lane in LANES)]
        for gauge, labels in labelled:
            if self.multiprocess:
                gauge.labels(*labels).set(0)
            else:
                gauge.remove(*labels)
