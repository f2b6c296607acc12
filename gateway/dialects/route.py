"""One HTTP route as data (``Route``), and how a route is mounted: body parsing, task gating, error shape.

A dialect module lists its routes in a ``ROUTES`` tuple; ``mount`` adds one
to an app. The same ``Route`` values build ``/openapi.json``
(``gateway.openapi``), so what is validated is what is documented.

Gating happens per request, from the router's current models (models can be
loaded and unloaded while the gateway runs):

1. no served model serves the route (``Route.serves``) → 404 ``Not Found``,
   as when vLLM does not register the route;
2. the body names (or defaults to) a model that does not serve it → 400,
   vLLM's "Unsupported task: ..." (``shared.limits.unsupported_task``).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from pydantic import BaseModel

from poolgate.gateway.dialects.body import parse_body
from poolgate.gateway.http.middleware import ERROR_FORMATS, EXACT
from poolgate.gateway.http.state import ERROR_FORMATTERS, RECORD, ROUTER
from poolgate.shared.errors import InvalidRequest, RouteNotFound
from poolgate.shared.limits import unsupported_task
from poolgate.shared.wire import ModelInfo

Handler = Callable[[web.Request, BaseModel | None], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """One route: ``handler(request, body)`` gets the body parsed into ``request_model`` (None for bodiless routes).

    ``tasks``: the route is served by a model that serves any of them; empty =
    always served (ops routes, ``/pooling``). ``serves`` replaces that test
    when a task list cannot say it (e.g. scoring needs a one-label classifier).
    ``operation`` names what a ``serves`` route does in the 400 for a model without it ("score").
    ``errors``: the error body shape, a key of ``middleware.ERROR_FORMATS``.
    ``response_model`` and ``summary`` only document the route.
    """

    method: str
    path: str
    handler: Handler
    request_model: type[BaseModel] | None = None
    response_model: type[BaseModel] | None = None
    tasks: tuple[str, ...] = ()
    serves: Callable[[ModelInfo], bool] | None = None
    operation: str | None = None
    errors: str = "openai"
    summary: str = ""

    def served_by(self, info: ModelInfo) -> bool:
        if self.serves is not None:
            return self.serves(info)
        return not self.tasks or any(task in info.tasks for task in self.tasks)

    @property
    def gated(self) -> bool:
        return bool(self.tasks) or self.serves is not None


def is_live(route: Route, models: list[ModelInfo]) -> bool:
    """Whether some served model serves ``route`` now."""
    return not route.gated or any(route.served_by(info) for info in models)


def mount(app: web.Application, route: Route) -> None:
    """Add ``route`` to ``app`` behind its parser and its gates."""

    async def handle(request: web.Request) -> web.StreamResponse:
        router = request.app[ROUTER]
        if not is_live(route, router.models()):
            raise RouteNotFound("Not Found")
        if route.tasks and (record := request.get(RECORD)) is not None:
            record.task = route.tasks[0]  # the operation is known before the model is (serve refines it)
        body = await parse_body(request, route.request_model) if route.request_model is not None else None
        if route.gated and body is not None:
            info = router.lookup(getattr(body, "model", None)).info
            if not route.served_by(info):
                task = route.tasks[0] if route.tasks else route.operation
                raise InvalidRequest(unsupported_task(info, task), param="model")
        return await route.handler(request, body)

    handle.__name__ = getattr(route.handler, "__name__", "handle")
    app.router.add_route(route.method, route.path, handle)
    app[ERROR_FORMATTERS][EXACT + route.path] = ERROR_FORMATS[route.errors]
