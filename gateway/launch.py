"""Runs a gateway on aiohttp's own lifecycle: ``web.run_app`` and one ``cleanup_ctx``.

Start-up and shutdown, in order:

1. ``run_app`` sets the app up; its cleanup_ctx ``Lifecycle.workers`` only starts
   the background task ``_bring_up`` and yields.
2. ``run_app`` binds the HTTP site, then calls its ``print`` hook
   (``Lifecycle.site_listening``), which logs "listening" and lets ``_bring_up``
   go on. From here ``/health`` answers 503 until the workers are ready.
3. ``_bring_up`` has the ``Fleet`` start every pool of the config
   (``gateway.pools.fleet``: local workers together, each under a
   ``gateway.pools.supervisor.Supervisor`` that restarts it with backoff when it
   dies; remote ones dialed, waiting for those still loading; DNS names
   watched), which adds each model's pools to the router; it logs "ready"
   (with ``--gateway-processes N``, the parent then starts its N-1 siblings
   on the same port in front of the same workers, ``gateway.scale_out``; a
   sibling runs ``run_gateway`` too, with the processes' shared folder), then
   health-checks every worker every ``health_probe_interval_s``
   (``gateway.pools.health.watch``). The admin API (``gateway.admin``) loads
   and unloads models through the same Fleet while the gateway runs.
4. SIGINT/SIGTERM: ``gateway.pools.drain`` drains (503 for new requests, calls in
   flight finish, up to ``drain_timeout_s``), then raises ``GracefulExit``;
   ``run_app`` stops the site, then runs the cleanup_ctx tear-down: cancel
   ``_bring_up``, wait for the siblings (the signal was passed on to them),
   stop every supervisor and its worker, close the router.

With ``--batch-dir`` the Batch API's store opens with the app
(``gateway.jobs.service``) in every gateway process, and the first process
(the only one of one, the parent of N) also runs the batches
(``gateway.jobs.runner``, a cleanup_ctx after the workers', so it stops
first): its lines go to a second site of the same app, a unix socket in the
owner-only folder of the local workers' sockets, which ``run_app`` binds
beside the port.

A start-up failure (no worker of some pool came up, a remote
worker that never answers) is logged as "could not start: ..." and stops
``run_app`` the way a signal does: a loop callback raises ``GracefulExit``.
A port in use makes ``run_app`` raise OSError before any worker is spawned.
Either way the tear-down above runs and ``run_gateway`` returns 1.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from poolgate.gateway.admin import FLEET
from poolgate.gateway.app import make_app
from poolgate.gateway.grpc.server import grpc_site
from poolgate.gateway.http import server_log
from poolgate.gateway.http.tenants import Tenants
from poolgate.gateway.jobs.metrics import BATCH_METRICS, BatchMetrics
from poolgate.gateway.jobs.runner import BatchRunner
from poolgate.gateway.jobs.service import BATCH_API
from poolgate.gateway.pools import health, loras
from poolgate.gateway.pools.drain import Drain
from poolgate.gateway.pools.fleet import Fleet
from poolgate.gateway.pools.router import Router
from poolgate.gateway.scale_out import Share, Siblings, parent_config, shared_folder, sibling_config
from poolgate.gateway.telemetry.metrics import GatewayMetrics
from poolgate.gateway.telemetry.record import Telemetry
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import PoolgateError

if TYPE_CHECKING:
    from poolgate.gateway.telemetry.tracing import SpanTracer

log = logging.getLogger("poolgate")


def run_gateway(config: GatewayConfig, share: Share | None = None) -> int:
    """Serve until SIGINT/SIGTERM; the process exit code (0, or 1 when start-up failed). ``share``: a sibling's
    folder of ``--gateway-processes`` (``gateway.scale_out``); the parent of N > 1 makes it here."""
    if config.gateway_processes > 1 and share is None:
        with shared_folder() as parent_share:
            return _serve(parent_config(config), parent_share)
    return _serve(config, share)


def _serve(config: GatewayConfig, share: Share | None) -> int:
    siblings = None
    if share is not None and share.parent:
        siblings = Siblings(share, config.gateway_processes, config.drain_timeout_s)
    lifecycle = Lifecycle(config, Router(), siblings=siblings)
    tracer = _tracer(config)
    metrics = None
    if config.metrics:
        metrics = GatewayMetrics(lifecycle.router, multiprocess_dir=share.metrics_dir if share is not None else None)
    runner = None
    if config.batch is not None and (share is None or share.parent):  # one process runs the batches
        runner = BatchRunner(str(lifecycle.folder / "gateway.sock"), ready=lifecycle.ready)
    app = make_app(
        config,
        lifecycle.router,
        cleanup_ctx=[
            *_flush_spans(tracer),
            lifecycle.workers,
            *grpc_site(config, draining=lambda: lifecycle.drain.task is not None),
            *([runner.run] if runner is not None else []),
            *_metrics_site(config, metrics),
            *_publish(metrics),
        ],
        telemetry=Telemetry(tracer=tracer, recorder=metrics),
        tenants=Tenants(config, cells=share.quota_cells(config) if share is not None else None),
    )
    if metrics is not None and config.batch is not None:
        app[BATCH_METRICS] = BatchMetrics(metrics, app[BATCH_API])
    if metrics is not None and config.metrics_port is None:
        metrics.add_route(app)
    app[FLEET] = lifecycle.fleet
    server_log.install()  # a malformed request: one WARNING line, never its bytes
    try:
        web.run_app(
            app,
            host=config.host,
            port=config.port,
            print=lifecycle.site_listening,
            access_log=None,
            handler_cancellation=True,
            reuse_port=config.reuse_port or None,
            path=runner.socket if runner is not None else None,
        )
    except OSError as exc:
        log.error("could not start: %s", exc)
        return 1
    finally:
        shutil.rmtree(lifecycle.folder, ignore_errors=True)
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
        await web.TCPSite(runner, config.host, config.metrics_port, reuse_port=config.reuse_port or None).start()
        log.info("metrics on http://%s:%d/metrics", config.host, config.metrics_port)
        yield
        await runner.cleanup()

    return [metrics_site]


def _publish(metrics: GatewayMetrics | None) -> list:
    """With several gateway processes, a cleanup_ctx that keeps this one's calls in flight and pool series in the shared
    files."""
    return [metrics.keep_publishing] if metrics is not None and metrics.multiprocess else []


def _tracer(config: GatewayConfig) -> SpanTracer | None:
    """The tracer of the ``llm_request`` spans; None (no tracing at all) without ``config.tracing``.
    The OpenTelemetry SDK is imported only when tracing is on."""
    if config.tracing is None:
        return None
    from poolgate.gateway.telemetry.tracing import build_tracer

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
    """The gateway's workers over one ``run_app``: brought up in the background, stopped at cleanup.

    ``fleet`` (``gateway.pools.fleet``) owns every worker: the config's pools at start-up,
    and the models the admin API loads and unloads later.
    """

    def __init__(
        self,
        config: GatewayConfig,
        router: Router,
        *,
        runner_factory: str | None = None,
        siblings: Siblings | None = None,
        signals: bool = True,
    ) -> None:
        self.config, self.router, self.siblings, self.signals = config, router, siblings, signals
        self.folder = Path(tempfile.mkdtemp(prefix="poolgate-"))  # local workers' sockets, owner-only
        self.fleet = Fleet(config, router, self.folder, runner_factory=runner_factory)
        self.drain = Drain(router, config.drain_timeout_s, _stop_run_app)
        self.listening = asyncio.Event()
        self.address = f"http://{config.host}:{config.port}"  # where it listens, as the logs say it
        self.ready = asyncio.Event()  # set once every pool is up, or start-up failed (``failed``)
        self.failed = False

    def site_listening(self, _banner: str) -> None:
        """``run_app``'s ``print`` hook, called once the HTTP site is bound."""
        log.info("listening on %s (starting workers; /health is 503 until they are ready)", self.address)
        self.listening.set()

    async def workers(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: bring the workers up in the background; at cleanup, stop them all."""
        if self.signals:
            self.drain.install(asyncio.get_running_loop(), also=self.siblings.signal if self.siblings else None)
        bring_up = asyncio.create_task(self._bring_up())
        try:
            yield
        finally:
            log.info("shutting down")
            bring_up.cancel()
            await asyncio.wait([bring_up])
            if self.siblings is not None:  # they drain on the workers, which stop after them
                await self.siblings.stop()
            await self.fleet.stop()
            await self.router.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    async def _bring_up(self) -> None:
        await self.listening.wait()
        try:
            await self.fleet.start(self.config.pools)
            for module in self.config.lora_modules:  # --lora-modules: on their base models' workers, then routed
                await loras.load(self.router, module.name, module.path, module.base_model_name)
        except Exception as exc:  # a known failure gets one line, anything else its traceback too
            log.error("could not start: %s", exc, exc_info=not isinstance(exc, (PoolgateError, OSError)))
            self.failed = True
            self.ready.set()
            if self.signals:
                asyncio.get_running_loop().call_soon(_stop_run_app)
            return
        self.ready.set()
        log.info(
            "ready: serving %s at %s/v1 (pools: %s)",
            ", ".join(self.router.pools),
            self.address,
            "; ".join(f"{name} on {', '.join(m.backends)}" for name, m in self.router.pools.items()),
        )
        if self.siblings is not None:
            self.siblings.start(sibling_config(self.config, self.fleet))
        await health.watch(self.router, self.config.health_probe_interval_s, self.config.health_check_timeout_s)


def _stop_run_app() -> None:
    """A loop callback that stops ``run_app`` exactly as its SIGTERM handler does."""
    raise web.GracefulExit()
