"""Runs a gateway on aiohttp's own lifecycle: ``web.run_app`` and one ``cleanup_ctx``.

Start-up and shutdown, in order:

1. ``run_app`` sets the app up; its cleanup_ctx ``Lifecycle.workers`` only starts
   the background task ``_bring_up`` and yields.
2. ``run_app`` binds the HTTP site, then calls its ``print`` hook
   (``Lifecycle.site_listening``), which logs "listening" and lets ``_bring_up``
   go on. From here ``/health`` answers 503 until the workers are ready.
3. ``_bring_up`` spawns the local workers (together), dials the remote ones
   (waiting for those still loading), adds one pool per model to the router,
   logs "ready", then probes workers marked down every
   ``health_probe_interval_s`` so they are re-marked once they answer.
4. SIGINT/SIGTERM: aiohttp's handler raises ``GracefulExit``; ``run_app``
   stops the site (in-flight requests finish), then runs the cleanup_ctx
   tear-down: cancel ``_bring_up``, close the router, stop every local worker.

A start-up failure (a worker that exits or is not ready in time, a remote
worker that never answers) is logged as "could not start: ..." and stops
``run_app`` the way a signal does: a loop callback raises ``GracefulExit``.
A port in use makes ``run_app`` raise OSError before any worker is spawned.
Either way the tear-down above runs and ``run_gateway`` returns 1.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from poolgate.gateway.app import make_app
from poolgate.gateway.local_worker import LocalWorker
from poolgate.gateway.metrics import GatewayMetrics
from poolgate.gateway.pool import WorkerPool
from poolgate.gateway.router import Router
from poolgate.gateway.telemetry import Telemetry
from poolgate.shared.config import GatewayConfig
from poolgate.shared.errors import Unavailable
from poolgate.shared.transport import WorkerClient

if TYPE_CHECKING:
    from poolgate.gateway.tracing import SpanTracer

log = logging.getLogger("poolgate")


def run_gateway(config: GatewayConfig) -> int:
    """Serve until SIGINT/SIGTERM; the process exit code (0, or 1 when start-up failed)."""
    lifecycle = Lifecycle(config, Router())
    tracer = _tracer(config)
    metrics = GatewayMetrics(lifecycle.router) if config.metrics else None
    app = make_app(config, lifecycle.router,
                   cleanup_ctx=[*_flush_spans(tracer), lifecycle.workers, *_metrics_site(config, metrics)],
                   telemetry=Telemetry(tracer=tracer, recorder=metrics))
    if metrics is not None and config.metrics_port is None:
        metrics.add_route(app)
    try:
        web.run_app(app, host=config.host, port=config.port, print=lifecycle.site_listening,
                    access_log=None, handler_cancellation=True)
    except OSError as exc:
        log.error("could not start: %s", exc)
        return 1
    return 1 if lifecycle.failed else 0


def _metrics_site(config: GatewayConfig, metrics: GatewayMetrics | None) -> list:
    """With ``--metrics-port``, a cleanup_ctx that serves ``/metrics`` alone on that port."""
    if metrics is None or config.metrics_port is None:
        return []

    async def metrics_site(app: web.Application) -> AsyncIterator[None]:
        metrics_app = web.Application()
        metrics.add_route(metrics_app)
        runner = web.AppRunner(metrics_app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, config.host, config.metrics_port).start()
        log.info("metrics on http://%s:%d/metrics", config.host, config.metrics_port)
        yield
        await runner.cleanup()

    return [metrics_site]


def _tracer(config: GatewayConfig) -> SpanTracer | None:
    """The tracer of the ``llm_request`` spans; None (no tracing at all) without ``config.tracing``.
    The OpenTelemetry SDK is imported only when tracing is on."""
    if config.tracing is None:
        return None
    from poolgate.gateway.tracing import build_tracer

    log.info("tracing to %s (%s)", config.tracing.endpoint, config.tracing.protocol)
    return build_tracer(config.tracing)


def _flush_spans(tracer: SpanTracer | None) -> list:
    """A cleanup_ctx, first in the list so it tears down last: export the spans still queued."""
    if tracer is None:
        return []

    async def flush_spans(app: web.Application) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(tracer.shutdown)

    return [flush_spans]


class Lifecycle:
    """The gateway's workers over one ``run_app``: brought up in the background, stopped at cleanup."""

    def __init__(self, config: GatewayConfig, router: Router) -> None:
        self.config, self.router = config, router
        self.local_workers: list[LocalWorker] = []
        self.listening = asyncio.Event()
        self.failed = False

    def site_listening(self, _banner: str) -> None:
        """``run_app``'s ``print`` hook, called once the HTTP site is bound."""
        log.info("listening on http://%s:%d (starting workers; /health is 503 until they are ready)",
                 self.config.host, self.config.port)
        self.listening.set()

    async def workers(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: bring the workers up in the background; at cleanup, stop them all."""
        with tempfile.TemporaryDirectory(prefix="poolgate-") as folder:
            bring_up = asyncio.create_task(self._bring_up(Path(folder)))
            yield
            log.info("shutting down")
            bring_up.cancel()
            await asyncio.wait([bring_up])
            await self.router.close()
            await asyncio.gather(*(w.stop() for w in self.local_workers), return_exceptions=True)

    async def _bring_up(self, folder: Path) -> None:
        await self.listening.wait()
        try:
            workers = await _start_workers(self.config, folder, self.local_workers)
        except Exception as exc:  # a known failure gets one line, anything else its traceback too
            log.error("could not start: %s", exc, exc_info=not isinstance(exc, (Unavailable, OSError)))
            self.failed = True
            asyncio.get_running_loop().call_soon(_stop_run_app)
            return
        for pool in _build_pools(self.config, workers):
            self.router.add(pool)
        log.info("ready: serving %s at http://%s:%d/v1", ", ".join(self.router.pools),
                 self.config.host, self.config.port)
        await _probe_down_workers(self.router, self.config.health_probe_interval_s)


def _stop_run_app() -> None:
    """A loop callback that stops ``run_app`` exactly as its SIGTERM handler does."""
    raise web.GracefulExit()


async def _start_workers(config: GatewayConfig, folder: Path, locals_: list[LocalWorker]) -> list[tuple]:
    """Spawn the local workers (together) and connect the remote ones; (client, info) pairs.

    If one local worker fails, the others are cancelled, which stops them.
    """
    try:
        async with asyncio.TaskGroup() as group:
            for i, cfg in enumerate(config.workers):
                locals_.append(worker := LocalWorker())
                group.create_task(worker.start(cfg, _local_address(config.transport, folder, i),
                                               ready_timeout=config.startup_timeout_s))
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    remote = [await _connect_remote(url, config.startup_timeout_s) for url in config.worker_urls]
    return [(w.client, w.info) for w in locals_] + [(c, await c.info()) for c in remote]


def _local_address(transport: str, folder: Path, index: int) -> str:
    if transport == "unix":
        return f"unix:{folder / f'worker-{index}.sock'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


async def _connect_remote(url: str, timeout_s: float) -> WorkerClient:
    """Dial a remote worker until it answers (it may still be loading), up to ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    delay = 0.1
    while True:
        try:
            return await WorkerClient.connect(url)
        except Unavailable:
            if asyncio.get_running_loop().time() + delay > deadline:
                raise
            log.info("waiting for worker %s", url)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


def _build_pools(config: GatewayConfig, workers: list[tuple]) -> list[WorkerPool]:
    """One pool per served model name, holding every worker that serves it."""
    by_name: dict[str, tuple] = {}
    for client, info in workers:
        by_name.setdefault(info.served_model_name, (info, []))[1].append(client)
    return [WorkerPool(info, members, max_in_flight=config.max_in_flight_per_worker)
            for info, members in by_name.values()]


async def _probe_down_workers(router: Router, interval_s: float) -> None:
    """Forever: give every worker marked down a health check; the pool re-marks it."""
    while True:
        await asyncio.sleep(interval_s)
        for pool in list(router.pools.values()):
            if not all(pool.is_ready(c) for c in pool.clients):
                await pool.probe()
