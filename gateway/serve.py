"""``poolgate serve``: flags → config, then the HTTP site, the workers, and a clean shutdown.

The HTTP site binds first, so ``/health`` answers 503 while weights load; each
worker's pool joins the router once the worker reports ready. SIGINT and
SIGTERM stop the site, then every local worker (no orphans).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import tempfile
from pathlib import Path

from aiohttp import web

from gateway.app import make_app
from gateway.local_worker import LocalWorker
from gateway.pool import WorkerPool
from gateway.router import Router
from shared.config import BACKEND_CHOICES, DTYPE_CHOICES, GatewayConfig, WorkerConfig
from shared.models import resolve_model
from shared.errors import Unavailable
from shared.transport import WorkerClient

log = logging.getLogger("poolgate")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="local model folder (HF or sentence-transformers layout); default: bundled all-MiniLM-L6-v2")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="auto: fastest dtype whose vectors stay at cosine >= 0.999 to float32")
    p.add_argument("--served-model-name", default=None, help="name clients use (default: MODEL as given)")
    p.add_argument("--max-model-len", type=int, default=None, help="longest input in tokens")
    p.add_argument("--max-batch-tokens", type=int, default=None,
                   help="token budget of one batch (default: 8192 on CPU, 32768 on CUDA/ROCm, 16384 on XPU)")
    p.add_argument("--auto-truncate", action="store_true",
                   help="truncate over-long inputs instead of rejecting them with 400")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 and /v2 routes")
    p.add_argument("--pooling-type", choices=("CLS", "MEAN", "LAST", "cls", "mean", "last"), default=None,
                   help="override the model's pooling")
    p.add_argument("--no-normalize", dest="normalize", action="store_false", default=None,
                   help="do not L2-normalize embeddings by default")
    p.add_argument("--allow-pickle-weights", action="store_true",
                   help="allow loading pytorch_model.bin (pickle) when no safetensors exist")
    p.add_argument("--workers", type=int, default=1, help="local worker processes for the model")
    p.add_argument("--num-threads", type=int, default=None, help="torch threads per worker (default: physical cores)")
    p.add_argument("--transport", choices=("unix", "tcp"), default="unix", help="gateway<->local worker transport")
    p.add_argument("--worker-url", action="append", default=[],
                   help="a running worker to use instead of spawning one: tcp://host:port or unix:/path")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--log-level", default="INFO")


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    workers: tuple[WorkerConfig, ...] = ()
    if not args.worker_url:
        path, name = resolve_model(args.model)
        worker = WorkerConfig(
            model_path=path, served_model_name=args.served_model_name or name, backend=args.backend,
            dtype=args.dtype, max_model_len=args.max_model_len, max_batch_tokens=args.max_batch_tokens,
            allow_pickle_weights=args.allow_pickle_weights, pooling_type=args.pooling_type,
            normalize=args.normalize, num_threads=args.num_threads,
        )
        workers = (worker,) * args.workers
    return GatewayConfig(
        host=args.host, port=args.port, api_key=args.api_key, auto_truncate=args.auto_truncate,
        transport=args.transport, worker_urls=tuple(args.worker_url), workers=workers,
        startup_timeout_s=args.startup_timeout,
    )


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


def _build_pools(workers: list[tuple]) -> list[WorkerPool]:
    """One pool per served model name, holding every worker that serves it."""
    by_name: dict[str, tuple] = {}
    for client, info in workers:
        by_name.setdefault(info.served_model_name, (info, []))[1].append(client)
    return [WorkerPool(info, members) for info, members in by_name.values()]


async def _unless_stopped(work, stop: asyncio.Event):
    """``work``'s result, or None if ``stop`` is set first (``work`` is then cancelled)."""
    task, stopped = asyncio.ensure_future(work), asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


async def serve(config: GatewayConfig) -> int:
    """Run until SIGINT/SIGTERM; the HTTP site answers (503) while workers start. Returns the exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    router = Router()
    runner = web.AppRunner(make_app(config, router), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    log.info("listening on http://%s:%d (starting workers; /health is 503 until they are ready)",
             config.host, config.port)
    locals_: list[LocalWorker] = []
    with tempfile.TemporaryDirectory(prefix="poolgate-") as folder:
        try:
            workers = await _unless_stopped(_start_workers(config, Path(folder), locals_), stop)
            if workers is not None:
                for pool in _build_pools(workers):
                    router.add(pool)
                log.info("ready: serving %s at http://%s:%d/v1", ", ".join(router.pools), config.host, config.port)
                await stop.wait()
            return 0
        except (Unavailable, OSError) as exc:
            log.error("could not start the workers: %s", exc)
            return 1
        finally:
            log.info("shutting down")
            await runner.cleanup()
            await router.close()
            await asyncio.gather(*(w.stop() for w in locals_), return_exceptions=True)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except (FileNotFoundError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    return asyncio.run(serve(config))
