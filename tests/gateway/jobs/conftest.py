"""The Batch API's test gateway: the real app, store and runner (its lines over a real unix socket of the same
app), over real workers around the fake runner, on a loopback port for the unmodified ``openai`` SDK."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import io
import json
import time
from pathlib import Path

import pytest
from aiohttp import web
from openai import AsyncOpenAI

from poolgate.gateway.app import make_app
from poolgate.gateway.jobs.metrics import BATCH_METRICS, BatchMetrics
from poolgate.gateway.jobs.runner import BatchRunner
from poolgate.gateway.jobs.service import BATCH_API
from poolgate.gateway.telemetry.metrics import GatewayMetrics
from poolgate.gateway.telemetry.record import Telemetry
from poolgate.shared.config.frozen import BatchConfig, GatewayConfig, Tenant
from tests.fakes import fake_model
from tests.gateway.conftest import served_router

FINAL = ("completed", "failed", "expired", "cancelled")
KEYS = {"team-a": "sk-team-a", "team-b": "sk-team-b"}


class Clock:
    """A wall clock the test can move forward (the Batch API's expiry)."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@dataclasses.dataclass
class BatchServer:
    url: str
    app: web.Application
    runner: BatchRunner
    model: object
    folder: Path
    clock: Clock
    metrics: GatewayMetrics | None
    stack: contextlib.AsyncExitStack
    site_runner: web.AppRunner
    stopped: bool = False

    async def stop(self) -> None:
        """Stop the gateway as a shutdown does (the runner leaves its batches in_progress)."""
        if not self.stopped:
            self.stopped = True
            await self.site_runner.cleanup()

    def client(self, key: str = "no-key") -> AsyncOpenAI:
        """The unmodified SDK on this gateway (no retries: every answer is seen), closed with the server."""
        client = AsyncOpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=30)
        self.stack.push_async_callback(client.close)
        return client

    async def wait(self, client: AsyncOpenAI, batch_id: str, until=FINAL, timeout: float = 20.0):
        """The batch once its status is one of ``until``."""
        deadline = time.monotonic() + timeout
        while True:
            batch = await client.batches.retrieve(batch_id)
            if batch.status in until:
                return batch
            assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
            await asyncio.sleep(0.05)


def jsonl(lines) -> io.BytesIO:
    """A JSONL upload of ``lines`` (dicts, or raw strings written as they are)."""
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    return io.BytesIO(text.encode())


def embed_line(custom_id: str, text, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "fake-model", "input": text, **body}}


def tenants() -> tuple[Tenant, ...]:
    return tuple(Tenant(name, (hashlib.sha256(key.encode()).hexdigest(),)) for name, key in KEYS.items())


@pytest.fixture
async def batch_server(tmp_path):
    """``await batch_server(with_tenants=False, model=None, metrics=False, tracer=None, **BatchConfig's fields)``
    -> a started ``BatchServer``; ``with_tenants``: the tenants of ``KEYS``."""
    async with contextlib.AsyncExitStack() as stack:
        started: list[int] = []

        async def start(*, with_tenants: bool = False, model=None, metrics: bool = False, tracer=None,
                        jobs_at_once: int = 2, chunk_lines: int = 1000, **batch) -> BatchServer:
            model = model or fake_model()
            router = await stack.enter_async_context(served_router([model]))
            folder = tmp_path / "batches"
            config = GatewayConfig(batch=BatchConfig(dir=str(folder), **batch),
                                   tenants=tenants() if with_tenants else ())
            started.append(1)
            socket = tmp_path / f"gateway-{len(started)}.sock"  # each server its own (a second on one folder)
            runner = BatchRunner(str(socket), jobs_at_once=jobs_at_once, poll_s=0.1, progress_s=0.1,
                                 chunk_lines=chunk_lines, lock_retry_s=0.1)
            recorder = GatewayMetrics(router) if metrics else None
            app = make_app(config, router, cleanup_ctx=[runner.run],
                           telemetry=Telemetry(tracer=tracer, recorder=recorder))
            clock = Clock()
            app[BATCH_API].clock = clock
            if recorder is not None:
                app[BATCH_METRICS] = BatchMetrics(recorder, app[BATCH_API])
                recorder.add_route(app)
            site_runner = web.AppRunner(app, handler_cancellation=True)
            await site_runner.setup()
            site = web.TCPSite(site_runner, "127.0.0.1", 0)
            await site.start()
            await web.UnixSite(site_runner, str(socket)).start()
            host, port = site_runner.addresses[0][:2]
            server = BatchServer(f"http://{host}:{port}", app, runner, model, folder, clock, recorder, stack,
                                 site_runner)
            stack.push_async_callback(server.stop)
            return server

        yield start
