"""The Batch API of one gateway process: its settings, its store once open, and what its routes share.

``make_app`` puts a ``BatchApi`` on the app when ``--batch-dir`` is given
and adds its ``open`` cleanup_ctx, which opens the store
(``gateway.jobs.store``) off the event loop before the app serves and closes
it after. Without ``--batch-dir`` the routes are off (``batch_off``: 404 with
how to turn them on, and not in ``/openapi.json``).

Whose is what: the caller's tenant (``gateway.http.tenants``: the tenant of
its API key, ``default`` for ``--api-key``), or, when the gateway has no keys
at all, the one shared owner ``default``; adding ``--api-key`` later keeps
those files and batches with the ``--api-key``'s tenant.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from poolgate.gateway.http.state import TENANT
from poolgate.gateway.http.tenants import DEFAULT_TENANT
from poolgate.gateway.jobs.store import Store
from poolgate.shared.config.frozen import BatchConfig, GatewayConfig


class BatchApi:
    """The settings, the store (once ``open``) and the runner's wake-up of one process's Batch API."""

    def __init__(self, config: BatchConfig, clock: Callable[[], float] = time.time):
        self.config, self.clock = config, clock
        self._store: Store | None = None
        self.wake = asyncio.Event()  # set when a batch is made or cancelled here: the runner looks at once

    @property
    def store(self) -> Store:
        assert self._store is not None, "the Batch API's store opens with the app (BatchApi.open)"
        return self._store

    def now(self) -> int:
        return int(self.clock())

    async def open(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: the store opened before the app serves, closed after."""
        self._store = await asyncio.to_thread(Store, self.config.dir)
        try:
            yield
        finally:
            await asyncio.to_thread(self._store.close)


BATCH_API = web.AppKey("batch_api", BatchApi)


def batch_off(config: GatewayConfig) -> str | None:
    """Why the Batch API's routes are off under ``config`` (``dialects.route.Route.off``)."""
    if config.batch is not None:
        return None
    return "The Batch API is off: start the gateway with --batch-dir DIR (batch_dir in a config file) to turn it on."


def api_of(request: web.Request) -> BatchApi:
    return request.app[BATCH_API]


def owner_of(request: web.Request) -> str:
    """The caller's tenant name (module doc)."""
    tenant = request.get(TENANT)
    return tenant.name if tenant is not None else DEFAULT_TENANT
