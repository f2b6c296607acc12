"""A gateway of one's own for a job: the serve flags' models behind a unix socket, no TCP port.

``poolgate run-batch`` without ``--url`` runs its lines here: the same app,
routes, tokenizer, pools and workers as ``poolgate serve`` with the same
flags, listening only on a socket in a fresh owner-only folder, so each line
gets exactly the answer the HTTP route gives and nothing else can reach it.
The workers are the gateway's local workers (their own processes, as in
``serve``); the gateway stops them when the context ends.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from poolgate.gateway.admin import FLEET
from poolgate.gateway.app import make_app
from poolgate.gateway.launch import Lifecycle
from poolgate.gateway.pools.router import Router
from poolgate.gateway.telemetry.record import Telemetry
from poolgate.shared.config.frozen import GatewayConfig

log = logging.getLogger("poolgate")


class StartFailed(Exception):
    """The private gateway's models did not come up (the log says why)."""


@asynccontextmanager
async def private_gateway(config: GatewayConfig) -> AsyncIterator[str]:
    """The path of the unix socket of a gateway serving ``config``'s models, once every one is ready."""
    if config.gateway_processes > 1:
        raise ValueError("a job's own gateway is one process; --gateway-processes is for `poolgate serve`")
    folder = Path(tempfile.mkdtemp(prefix="poolgate-job-"))  # mode 0700
    path = folder / "gateway.sock"
    lifecycle = Lifecycle(config, Router(), signals=False)
    lifecycle.address = f"http+unix://{path}"
    app = make_app(config, lifecycle.router, cleanup_ctx=[lifecycle.workers], telemetry=Telemetry())
    app[FLEET] = lifecycle.fleet
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        await web.UnixSite(runner, str(path)).start()
        lifecycle.site_listening("")
        await lifecycle.ready.wait()
        if lifecycle.failed:
            raise StartFailed("the model did not start; see the log above")
        yield str(path)
    finally:
        await runner.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
