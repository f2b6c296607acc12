"""The Batch API's Prometheus series: batches by status, lines and tokens done, and each running batch's progress.

- ``poolgate_batch_jobs{status}`` and ``poolgate_batch_job_progress_ratio{batch_id,
  tenant}`` (lines finished over lines, for each batch in progress,
  finalizing or cancelling; a batch's series goes when it ends) are read from
  the store at each scrape (``JobsCollector``, a ``Pulled`` collector of
  ``gateway.telemetry.metrics``), so every gateway process of
  ``--gateway-processes N`` answers them alike (the store is shared; the
  runner writes its counts about once a second);
- ``poolgate_batch_job_lines_total{tenant, outcome}`` and
  ``poolgate_batch_job_tokens_total{tenant}`` count as the runner finishes
  lines (the process that runs the jobs; with N processes in the shared
  multiprocess files like every counter).

Each line also counts as the request it is in every request series
(``poolgate_requests_total`` on its route, its tenant's), as it runs through
the same routes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from poolgate.gateway.jobs.job import Counts
from poolgate.gateway.jobs.service import BatchApi
from poolgate.gateway.jobs.store import STATUSES, Row
from poolgate.gateway.telemetry.metrics import GatewayMetrics
from poolgate.shared.telemetry import names

RUNNING = ("in_progress", "finalizing", "cancelling")  # the statuses a batch's progress series is shown in


class JobsCollector:
    """``poolgate_batch_jobs`` and the progress of each running batch, from the store's last ``refresh``."""

    def __init__(self, api: BatchApi):
        self.api = api
        self.by_status: dict[str, int] = {}
        self.active: list[Row] = []

    async def refresh(self) -> None:
        store = self.api.store
        self.by_status, self.active = await asyncio.gather(
            asyncio.to_thread(store.counts_by_status), asyncio.to_thread(store.active)
        )

    def describe(self) -> list[Metric]:
        return []  # collected only at scrape time, after refresh

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(names.BATCH_JOBS, "Batch API batches by status.", labels=[names.STATUS])
        for status in STATUSES:
            jobs.add_metric([status], float(self.by_status.get(status, 0)))
        progress = GaugeMetricFamily(
            names.BATCH_JOB_PROGRESS,
            "Lines finished over lines, of each running batch.",
            labels=[names.BATCH_ID, names.TENANT],
        )
        for row in self.active:
            if row["status"] in RUNNING and row["total"]:
                done = (row["completed"] + row["failed"]) / row["total"]
                progress.add_metric([row["id"], row["owner"]], float(done))
        yield jobs
        yield progress


class BatchMetrics:
    """The Batch API's counters, and its store's series on ``metrics``' scrapes (module doc)."""

    def __init__(self, metrics: GatewayMetrics, api: BatchApi):
        registry = None if metrics.multiprocess else metrics.registry
        self.lines = Counter(
            names.BATCH_JOB_LINES, "Batch lines finished, by outcome.", [names.TENANT, names.OUTCOME], registry=registry
        )
        self.tokens = Counter(
            names.BATCH_JOB_TOKENS, "Input tokens of completed batch lines.", [names.TENANT], registry=registry
        )
        metrics.add_pulled(JobsCollector(api))

    def counting(self, tenant: str) -> Callable[[Counts], None]:
        """A ``Counts`` listener that adds a job's new lines and tokens to the counters."""
        seen = Counts()

        def listener(counts: Counts) -> None:
            if counts.completed != seen.completed:
                self.lines.labels(tenant, "completed").inc(counts.completed - seen.completed)
                seen.completed = counts.completed
            if counts.failed != seen.failed:
                self.lines.labels(tenant, "failed").inc(counts.failed - seen.failed)
                seen.failed = counts.failed
            if counts.tokens != seen.tokens:
                self.tokens.labels(tenant).inc(counts.tokens - seen.tokens)
                seen.tokens = counts.tokens

        return listener


BATCH_METRICS = web.AppKey("batch_metrics", BatchMetrics)  # set where the gateway's metrics are made
