"""Runs a gateway: the HTTP site first, then the workers, health probes, and a clean shutdown.

The site binds before any worker starts, so ``/health`` answers 503 while
weights load; each model's pool joins the router once its workers report
ready. A probe loop asks workers marked down (connection lost) for their
health every ``health_probe_interval_s`` and puts them back once they answer.
SIGINT and SIGTERM stop the site, then every local worker (no orphans).
"""
from __future__ import annotations

import asyncio
import logging
import signal
import socket
import tempfile
from pathlib import Path

from aiohttp import web

from poolgate.gateway.app import make_app
from poolgate.gateway.local_worker import LocalWorker
from poolgate.gateway.pool import WorkerPool
from poolgate.gateway.router import Router
from poolgate.shared.config import GatewayConfig
from poolgate.shared.errors import Unavailable
from poolgate.shared.transport import WorkerClient

log = logging.getLogger("poolgate")


def _local_address(transport: str, folder: Path, index: int) -> str:
    if transport == "unix":
        return f"unix:{folder / f'worker-{index}.sock'}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


async def _start_workers(config: GatewayConfig, folder: Path, locals_: list[LocalWorker]) -> list[tuple]:
    """Spawn the local workers (together) and connect the remote ones; (client, info) pairs."""
    for _ in config.workers:
        locals_.append(LocalWorker())
    await asyncio.gather(*(
        w.start(cfg, _local_address(config.transport, folder, i), ready_timeout=config.startup_timeout_s)
        for i, (w, cfg) in enumerate(zip(locals_, config.workers))
    ))
    remote = [await _connect_remote(url, config.startup_timeout_s) for url in config.worker_urls]
    return [(w.client, w.info) for w in locals_] + [(c, await c.info()) for c in remote]


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


async def _unless_stopped(work, stop: asyncio.Event):
    """``work``'s result, or None if ``stop`` is set first (``work`` is then cancelled)."""
    task, stopped = asyncio.ensure_future(work), asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


async def _serve_until_stopped(config: GatewayConfig, router: Router, stop: asyncio.Event,
                               locals_: list[LocalWorker], folder: Path) -> None:
    workers = await _unless_stopped(_start_workers(config, folder, locals_), stop)
    if workers is None:
        return
    for pool in _build_pools(config, workers):
        router.add(pool)
    log.info("ready: serving %s at http://%s:%d/v1", ", ".join(router.pools), config.host, config.port)
    prober = asyncio.ensure_future(_probe_down_workers(router, config.health_probe_interval_s))
    try:
        await stop.wait()
    finally:
        prober.cancel()


async def run_gateway(config: GatewayConfig) -> int:
    """Serve until SIGINT/SIGTERM; returns the process exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    router = Router()
    runner = web.AppRunner(make_app(config, router), access_log=None, handler_cancellation=True)
    await runner.setup()
    locals_: list[LocalWorker] = []
    try:
        await web.TCPSite(runner, config.host, config.port).start()
        log.info("listening on http://%s:%d (starting workers; /health is 503 until they are ready)",
                 config.host, config.port)
        with tempfile.TemporaryDirectory(prefix="poolgate-") as folder:
            await _serve_until_stopped(config, router, stop, locals_, Path(folder))
        return 0
    except (Unavailable, OSError) as exc:
        log.error("could not start: %s", exc)
        return 1
    finally:
        log.info("shutting down")
        await runner.cleanup()
        await router.close()
        await asyncio.gather(*(w.stop() for w in locals_), return_exceptions=True)
