"""CORS for the origins ``--allowed-origins`` names (off unless set): preflights answered, responses marked.

With no origins configured nothing here adds a header and a preflight gets
what it got before (404 for an unknown path, 405 for a known one: no route
takes OPTIONS). With origins, a request whose ``Origin`` is one of them (or
any, for ``*``) gets ``Access-Control-Allow-Origin`` (the origin itself, or
``*``) and ``Vary: Origin``; its preflight on a known path is a 204 naming
the path's methods, the ``Authorization``, ``Content-Type``,
``X-Request-Id``, ``X-Request-Timeout`` and ``X-Poolgate-Lane`` headers and a
max age. No
``Access-Control-Allow-Credentials`` is ever sent: API keys go in the
``Authorization`` header, which needs no credentials mode.
"""

from __future__ import annotations

from aiohttp import web

ALLOW_HEADERS = "Authorization, Content-Type, X-Request-Id, X-Request-Timeout, X-Poolgate-Lane"
EXPOSE_HEADERS = "Retry-After, X-Request-Id"
MAX_AGE_S = "600"


def allowed_origin(request: web.Request, origins: tuple[str, ...]) -> str | None:
    """The value of ``Access-Control-Allow-Origin`` for ``request``; None: no CORS headers."""
    origin = request.headers.get("Origin")
    if not origins or origin is None:
        return None
    if "*" in origins:
        return "*"
    return origin if origin in origins else None


def preflight(request: web.Request, allow_origin: str) -> web.Response | None:
    """A preflight's 204 on a known path (None when ``request`` is not a preflight or its path is unknown)."""
    if request.method != "OPTIONS" or "Access-Control-Request-Method" not in request.headers:
        return None
    missing = request.match_info.http_exception
    if not isinstance(missing, web.HTTPMethodNotAllowed):  # 404: no such path
        return None
    methods = ", ".join(sorted(m for m in missing.allowed_methods if m != "OPTIONS"))
    response = web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Methods": methods,
            "Access-Control-Allow-Headers": ALLOW_HEADERS,
            "Access-Control-Max-Age": MAX_AGE_S,
        },
    )
    mark(response, allow_origin)
    return response


def mark(response: web.StreamResponse, allow_origin: str) -> None:
    """Let the browser read ``response`` from ``allow_origin``'s page."""
    response.headers["Access-Control-Allow-Origin"] = allow_origin
    response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
    if allow_origin != "*":
        response.headers.add("Vary", "Origin")
