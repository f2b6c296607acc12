"""The gateway's one request middleware: request id, telemetry, API key, errors to HTTP bodies.

Every rule about a request comes from the route it matched
(``dialects.route.route_of``): the API key is checked unless the route is
``public`` (any key of ``http.tenants``: ``--api-key`` or a tenant's from
``--api-keys-file``; an ``admin`` route takes ``--api-key`` only), a recorded
request counts against its tenant's quotas (429 with ``Retry-After`` over
one), a telemetry record is opened only for a ``recorded`` route, and
errors are written in the route's ``errors`` shape. CORS (``http.cors``) only
for ``--allowed-origins``: their preflights answered, their responses marked.
A request that matches no route (404) needs the key like any API route, is
recorded under the route label "unmatched" and answers in OpenAI's shape; a wrong method on a known
path (405) takes that path's rules. On a path two dialects share, errors
after the body was read answer in the shape of the dialect the body is.

It opens each recorded request's telemetry record (the ``llm_request`` span
and its metrics, ``gateway.telemetry.record``) on arrival and ends it once the
response is written, so the span and the latency cover writing the body too.

Every exception a handler lets out is turned into an error body here and
nowhere else: ``PoolgateError`` by its own status, aiohttp's HTTP exceptions
(404 no route, 405 wrong method, 413 body too large) by theirs, anything
else as a logged 500. A 429 or 503 carries ``Retry-After``: the error's own
``retry_after_s`` (admission's drain time, a tenant's bucket), else 1 s.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from aiohttp import web
from aiohttp.typedefs import Handler

from poolgate.gateway.dialects.route import Route, route_of
from poolgate.gateway.http.cors import allowed_origin, mark, preflight
from poolgate.gateway.http.errors import ERROR_FORMATS, HTTPError
from poolgate.gateway.http.state import CHOSEN, CONFIG, RECORD, REQUEST_ID, TELEMETRY, TENANT, TENANTS
from poolgate.gateway.http.tenants import TenantState
from poolgate.gateway.http.timings import timing_headers
from poolgate.gateway.http.trusted import TRUSTED
from poolgate.gateway.serving import Scope
from poolgate.gateway.telemetry.record import RequestRecord
from poolgate.shared.domain.errors import ClientClosedRequest, Forbidden, InternalError, PoolgateError, Unauthorized
from poolgate.shared.telemetry.log_limit import LogLimiter

log = logging.getLogger(__name__)
_failures = LogLimiter(log)  # the same failure of many requests (a dead pool): once per window, with a count

REQUEST_ID_HEADER = "X-Request-Id"
MAX_REQUEST_ID_CHARS = 256
RETRY_AFTER_S = "1"
RETRY_STATUSES = (429, 503)


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = _request_id(request)
    request[REQUEST_ID] = request_id
    route = await route_of(request)
    origin = allowed_origin(request, request.app[CONFIG].allowed_origins) if CONFIG in request.app else None
    if origin is not None and (answer := preflight(request, origin)) is not None:  # CORS (http.cors)
        answer.headers[REQUEST_ID_HEADER] = request_id
        return answer
    telemetry = request.app[TELEMETRY]
    record = request[RECORD] = telemetry.begin(request, request_id) if route.recorded else None
    error: PoolgateError | None = None
    tenant = request[TENANT] = None
    try:
        tenant = request[TENANT] = _authenticate(request, route)
        if tenant is not None and record is not None:
            record.tenant = tenant.name
            tenant.admit()  # its quotas (http.tenants): 429 with Retry-After when over one
        else:
            tenant = None  # nothing to leave
        try:
            response = await handler(request)
        finally:
            if tenant is not None:
                tenant.leave()
    except asyncio.CancelledError:  # the client left and aiohttp cancelled the handler
        if record is not None:
            closed = ClientClosedRequest("client closed the request")
            telemetry.end(record, closed.status, closed)
        raise
    except web.HTTPException as exc:
        if exc.status < 400:
            exc.headers[REQUEST_ID_HEADER] = request_id
            if record is not None:
                telemetry.end(record, exc.status, None)
            raise
        error = HTTPError(exc)
    except PoolgateError as err:
        error = err
    except Exception as exc:
        _failures.log(
            logging.ERROR,
            ("unhandled", route.path, type(exc)),
            "unhandled error in %s %s (request %s)",
            request.method,
            request.path,
            request_id,
            exc_info=True,
        )
        error = InternalError("Internal server error.")
    if error is not None:
        response = error_response(request, error, request.get(CHOSEN, route))
    elif record is not None:
        response.headers.update(timing_headers(record))  # TEI's timing headers (http.timings)
    response.headers[REQUEST_ID_HEADER] = request_id
    if origin is not None:
        mark(response, origin)
    if record is not None:
        await _write_and_end(request, response, record, error)
    return response


async def _write_and_end(
    request: web.Request, response: web.StreamResponse, record: RequestRecord, error: PoolgateError | None
) -> None:
    """Write the response here, so the span and the latency cover writing the body; end the record
    whatever happens (a client that leaves mid-body is a 499)."""
    status = response.status
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        pass  # the client left; aiohttp would have dropped the body the same way
    except BaseException:
        error = ClientClosedRequest("client closed the request while the response was written")
        status = error.status
        raise
    finally:
        request.app[TELEMETRY].end(record, status, error)


def _request_id(request: web.Request) -> str:
    incoming = request.headers.get(REQUEST_ID_HEADER, "")
    if 0 < len(incoming) <= MAX_REQUEST_ID_CHARS and incoming.isascii() and incoming.isprintable():
        return incoming
    return uuid.uuid4().hex


def _authenticate(request: web.Request, route: Route) -> TenantState | None:
    """The caller's tenant (``caller``); None when no key is needed (no keys configured, a public route, a
    CORS preflight)."""
    if not request.app[TENANTS].enabled or request.method == "OPTIONS" or route.public:
        return None
    return caller(request, admin=route.admin)


def caller(request: Scope, *, admin: bool = False) -> TenantState:
    """The caller's tenant by its ``Authorization: Bearer KEY`` (``http.tenants``, constant time) or this
    process's job token (``http.trusted``): 401 without a known key, 403 for a tenant's key where ``admin``.
    The gRPC server (``gateway.grpc.call``) asks it too, with a call's metadata as the headers."""
    tenants = request.app[TENANTS]
    trusted = request.app.get(TRUSTED)
    tenant = trusted.tenant_of(request, tenants) if trusted is not None else None
    if tenant is not None:
        if admin:
            raise Forbidden("The admin API takes the server's own API key (--api-key), not a job's token.")
        return tenant
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    tenant = tenants.identify(key) if scheme == "Bearer" else None
    if tenant is None:
        raise Unauthorized("Unauthorized: missing or invalid API key.")
    if admin and not tenant.admin:
        raise Forbidden("The admin API takes the server's own API key (--api-key), not a tenant's.")
    return tenant


def _retry_after(err: PoolgateError) -> str:
    """Whole seconds: the error's own (admission's drain time, a tenant's bucket), else the default."""
    seconds = getattr(err, "retry_after_s", None)
    return str(max(1, round(seconds))) if seconds is not None else RETRY_AFTER_S


def error_response(request: web.Request, err: PoolgateError, route: Route) -> web.Response:
    """The error body for ``err`` in ``route``'s shape."""
    if err.status >= 500 and not (err.status == 503 and route.quiet_503):
        _failures.log(
            logging.WARNING,
            (err.status, err.message),
            "request %s failed: %s %s",
            request.get(REQUEST_ID),
            err.status,
            err.message,
        )
    headers = {"Retry-After": _retry_after(err)} if err.status in RETRY_STATUSES else {}
    if isinstance(err, HTTPError) and err.allow:
        headers["Allow"] = err.allow
    return web.json_response(ERROR_FORMATS[route.errors](err), status=err.status, headers=headers)
