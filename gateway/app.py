"""The aiohttp application factory: state, middleware, and every route of the route table."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable

from aiohttp import web

from poolgate.gateway import admin, lora_routes
from poolgate.gateway.dialects import all_routes, register
from poolgate.gateway.http import docs, openapi
from poolgate.gateway.http import ops as routes_ops
from poolgate.gateway.http.middleware import edge_middleware
from poolgate.gateway.http.state import CONFIG, ROUTE_OF, ROUTER, TELEMETRY, TENANTS
from poolgate.gateway.http.tenants import Tenants
from poolgate.gateway.http.trusted import TRUSTED, TrustedCaller
from poolgate.gateway.jobs import batches_routes, files_routes
from poolgate.gateway.jobs.service import BATCH_API, BatchApi
from poolgate.gateway.pools.router import Router
from poolgate.gateway.telemetry.record import Telemetry
from poolgate.gateway.tokenizing import tokenizer_pool
from poolgate.shared.config.frozen import GatewayConfig

CleanupCtx = Callable[[web.Application], AsyncIterator[None]]


def make_app(
    config: GatewayConfig,
    router: Router,
    *,
    cleanup_ctx: Iterable[CleanupCtx] = (),
    telemetry: Telemetry | None = None,
    tenants: Tenants | None = None,
) -> web.Application:
    """An app serving ``router``'s models; whoever built the router owns its workers.

    ``cleanup_ctx`` generators (start-up before their ``yield``, tear-down
    after) are attached in order, e.g. to spawn and stop local workers.
    ``telemetry`` (tracer and metrics) is off when not given; ``tenants``: the
    quotas' state (default: this process's own, ``gateway.http.tenants``). With ``config.batch`` the Batch
    API's store opens with the app (``gateway.jobs.service``); its runner is the caller's to add
    (``gateway.jobs.runner``: one process runs the jobs).
    """
    app = web.Application(middlewares=[edge_middleware], client_max_size=config.max_request_bytes)
    app[CONFIG] = config
    app[ROUTER] = router
    app[ROUTE_OF] = {}
    app[TELEMETRY] = telemetry or Telemetry()
    app[TENANTS] = tenants or Tenants(config)
    routes = [*all_routes(), *files_routes.ROUTES, *batches_routes.ROUTES]
    routes += [*routes_ops.ROUTES, *admin.ROUTES, *lora_routes.ROUTES, *openapi.ROUTES, *docs.ROUTES]
    app[openapi.ROUTES_KEY] = routes
    register(app, routes)
    app.cleanup_ctx.append(tokenizer_pool)
    if config.batch is not None:
        app[BATCH_API] = BatchApi(config.batch)
        app[TRUSTED] = TrustedCaller()
        app.cleanup_ctx.append(app[BATCH_API].open)
    app.cleanup_ctx.extend(cleanup_ctx)
    return app
