"""One HTTP route as data (``Route``: its handler and its rules), and how a route is mounted and found again.

A dialect module lists its routes in a ``ROUTES`` tuple; ``mount`` adds one
to an app and records it under the aiohttp route it became, so the edge
middleware reads a request's rules from the route it matched (``route_of``):
whether it needs the API key (``public``), whether it is counted and traced
(``recorded``), its error body shape (``errors``) and whether a 503 there is
routine (``quiet_503``). No list of paths elsewhere decides any of these, so
a new route is guarded, recorded and answered in the OpenAI shape unless it
says otherwise. The same ``Route`` values build ``/openapi.json``
(``gateway.http.openapi``), so what is validated is what is documented.

Gating happens per request, from the gateway's config and the router's current
models (models can be loaded and unloaded while the gateway runs):

0. the route is off under this config (``Route.off`` says why, e.g. the Batch
   API without ``--batch-dir``) → 404 with that reason, and it is left out of
   ``/openapi.json``;
1. no served model serves the route (``Route.serves``) → 404 ``Not Found``,
   as when vLLM does not register the route;
2. the body names (or defaults to) a model that does not serve it → 400,
   vLLM's "Unsupported task: ..." (``shared.domain.limits.unsupported_task``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from poolgate.gateway.dialects.body import parse_body, read_json, validated
from poolgate.gateway.http.errors import ERROR_FORMATS
from poolgate.gateway.http.state import CHOSEN, CONFIG, ROUTE_OF, ROUTER
from poolgate.gateway.serving import record_asked
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import InvalidRequest, RouteNotFound
from poolgate.shared.domain.limits import unsupported_task
from poolgate.shared.wire.messages import ModelInfo

# handler(request, body): body is an instance of the route's own request_model (or None), which a Callable type
# cannot say per route (its argument types are contravariant), hence Any.
Handler = Callable[[web.Request, Any], Awaitable[web.StreamResponse]]


class AsksEncodings(BaseModel):
    """A request body that says how its arrays come back encoded (its route records that, ``serve_route``)."""

    @property
    def encoding_formats(self) -> tuple[str, ...]:
        raise NotImplementedError


@dataclass(frozen=True)
class Route:
    """One route: ``handler(request, body)`` gets the body parsed into ``request_model`` (None for bodiless routes).

    ``tasks``: the route is served by a model that serves any of them; empty =
    always served (ops routes, ``/pooling``). ``serves`` replaces that test
    when a task list cannot say it (e.g. scoring needs a one-label classifier).
    ``operation`` names what a ``serves`` route does in the 400 for a model without it ("score").
    ``errors``: the error body shape, a key of ``http.errors.ERROR_FORMATS``.
    ``public``: served without the API key (ops routes, the API document); every other route needs it.
    ``admin``: only the ``--api-key`` opens it (a tenant's key from ``--api-keys-file`` does not).
    ``recorded``: counted in the metrics and traced (ops routes are not, as in vLLM).
    ``quiet_503``: a 503 here is routine ("still loading"), not logged as a failure.
    ``shape``: on a path two dialects share, whether a JSON body is this route's (module doc);
    ``alternatives``: the routes a shared path dispatches to (``shared`` builds it).
    ``query``: the query string's parameters, validated into this model and passed as the handler's ``body``
    (a route has a ``request_model`` or a ``query``, not both).
    ``form``: a ``multipart/form-data`` body, documented with this model; the handler reads it itself (an
    upload is streamed to disk, never held).
    ``framed``: a body the handler reads itself (JSON, possibly followed by raw bytes: the Open Inference
    Protocol's binary tensor data), documented as JSON with this model.
    ``off``: why the route is off under a config (it then answers 404 with that reason and is not documented);
    None when it is on.
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
    public: bool = False
    admin: bool = False
    recorded: bool = True
    quiet_503: bool = False
    shape: Callable[[object], bool] | None = None
    alternatives: tuple[Route, ...] = ()
    query: type[BaseModel] | None = None
    form: type[BaseModel] | None = None
    framed: type[BaseModel] | None = None
    off: Callable[[GatewayConfig], str | None] | None = None

    def __post_init__(self) -> None:
        if self.errors not in ERROR_FORMATS:
            raise ValueError(f"{self.method} {self.path}: unknown error shape {self.errors!r}")
        if sum(m is not None for m in (self.request_model, self.query, self.form, self.framed)) > 1:
            raise ValueError(f"{self.method} {self.path}: a JSON body, a query model, a form or a framed body, not two")

    def off_because(self, config: GatewayConfig) -> str | None:
        """Why the route is off under ``config``; None when it is on."""
        return None if self.off is None else self.off(config)

    def served_by(self, info: ModelInfo) -> bool:
        if self.alternatives:
            return any(alt.served_by(info) for alt in self.alternatives)
        if self.serves is not None:
            return self.serves(info)
        return not self.tasks or any(task in info.tasks for task in self.tasks)

    @property
    def gated(self) -> bool:
        return bool(self.tasks) or self.serves is not None or any(alt.gated for alt in self.alternatives)


def shared(routes: list[Route]) -> Route:
    """One route for ``routes`` (one method and path, all but one with a ``shape``): the body picks which."""
    defaults = [r for r in routes if r.shape is None]
    first = routes[0]
    if len(defaults) != 1 or any(
        (r.method, r.path, r.public, r.recorded) != (first.method, first.path, first.public, first.recorded)
        for r in routes
    ):
        raise ValueError(
            f"{first.method} {first.path}: routes sharing a path need one default, the others a "
            "shape, and the same public/recorded rules"
        )
    ordered = (*(r for r in routes if r.shape is not None), defaults[0])
    summary = " | ".join(r.summary for r in ordered) + " (the body's shape picks which)"
    return Route(
        first.method,
        first.path,
        defaults[0].handler,
        errors=defaults[0].errors,
        summary=summary,
        response_model=defaults[0].response_model,
        public=first.public,
        recorded=first.recorded,
        alternatives=ordered,
    )


def pick(route: Route, raw: object) -> Route:
    """The alternative of a shared route whose shape ``raw`` has (the default when none claims it)."""
    return next(alt for alt in route.alternatives if alt.shape is None or alt.shape(raw))


def is_live(route: Route, models: list[ModelInfo]) -> bool:
    """Whether some served model serves ``route`` now."""
    return not route.gated or any(route.served_by(info) for info in models)


def mount(app: web.Application, route: Route) -> None:
    """Add ``route`` to ``app`` behind its parser and its gates."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if not route.alternatives:
            return await serve_route(request, route, None)
        raw = await read_json(request)
        chosen = request[CHOSEN] = pick(route, raw)
        return await serve_route(request, chosen, raw)

    handle.__name__ = getattr(route.handler, "__name__", "handle")
    mounted = app.router.add_route(route.method, route.path, handle)
    app.setdefault(ROUTE_OF, {})[mounted] = route


async def serve_route(request: web.Request, route: Route, raw: object | None) -> web.StreamResponse:
    """``route``'s gates, parser and handler (``raw``: the JSON body a shared route already read)."""
    if route.off is not None and (why := route.off_because(request.app[CONFIG])) is not None:
        raise RouteNotFound(why)  # (only a route that can be off reads the config: /metrics' own app has none)
    router = request.app[ROUTER] if route.gated else None
    if router is not None and not is_live(route, router.models()):
        raise RouteNotFound("Not Found")
    if route.tasks:
        record_asked(request, task=route.tasks[0])  # the operation is known before the model is (serve refines it)
    body: BaseModel | None = None
    if route.request_model is not None:
        body = await parse_body(request, route.request_model) if raw is None else validated(raw, route.request_model)
    elif route.query is not None:
        body = validated(dict(request.query), route.query)
    if router is not None and body is not None:  # a gated route (the router is read for those only)
        info = router.lookup(getattr(body, "model", None)).info
        if not route.served_by(info):
            task = route.tasks[0] if route.tasks else route.operation
            raise InvalidRequest(unsupported_task(info, task), param="model")
    if isinstance(body, AsksEncodings):
        record_asked(request, formats=body.encoding_formats)
    return await route.handler(request, body)


async def _unmatched(request: web.Request, body: None) -> web.StreamResponse:
    raise RouteNotFound("Not Found")


# The rules of a request that matched no route (404): it needs the key, is recorded, answers in OpenAI's shape.
UNMATCHED = Route("*", "", _unmatched)


async def route_of(request: web.Request) -> Route:
    """The Route ``request`` matched; for a 405 (known path, wrong method) that path's first route, public
    only if all of the path's routes are; else ``UNMATCHED``."""
    table = request.app.get(ROUTE_OF, {})
    matched = table.get(request.match_info.route)
    if matched is not None:
        return matched
    same_path = [
        route
        for mounted, route in table.items()
        if mounted.resource is not None and (await mounted.resource.resolve(request))[1]
    ]
    if not same_path:
        return UNMATCHED
    return replace(same_path[0], public=all(route.public for route in same_path))
