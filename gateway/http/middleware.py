"""The gateway's one request middleware: request id, telemetry, API key, errors to HTTP bodies.

It opens each API request's telemetry record (the ``llm_request`` span and
its metrics, ``gateway.telemetry``) on arrival and ends it once the response
is written, so the span and the latency cover writing the body too.

Every exception a handler lets out is turned into an error body here and
nowhere else: ``PoolgateError`` by its own status, aiohttp's HTTP exceptions
(404 no route, 405 wrong method, 413 body too large) by theirs, anything
else as a logged 500. The body's shape is picked by path from
``app[ERROR_FORMATTERS]``: the exact path's entry (key ``"=" + path``), else
the longest matching prefix. Each route records its dialect's shape there
when mounted (``dialects.route.mount``), from ``ERROR_FORMATS``.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import uuid
from http import HTTPStatus

from aiohttp import web

from poolgate.gateway.http.state import CONFIG, ERROR_FORMATTERS, RECORD, REQUEST_ID, TELEMETRY
from poolgate.shared.errors import ClientClosedRequest, InternalError, PoolgateError, Unauthorized

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
MAX_REQUEST_ID_CHARS = 256
# vLLM's rule (only these paths need the API key), plus every unprefixed API route, which vLLM leaves open,
# and the admin API (gateway.admin), which is off altogether without an API key. Open: the ops routes
# (/health, /ping, /version, /metrics) and /openapi.json.
API_KEY_PREFIXES = ("/v1", "/v2", "/inference", "/cohere", "/classify", "/pooling", "/score", "/rerank",
                    "/tokenize", "/detokenize", "/invocations", "/admin")
RETRY_AFTER_S = "1"
RETRY_STATUSES = (429, 503)
QUIET_503_PATHS = frozenset({"/health", "/ping"})  # 503 there just means "still loading"


def openai_error_body(err: PoolgateError) -> dict:
    """The OpenAI (and vLLM) error envelope."""
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}


def cohere_error_body(err: PoolgateError) -> dict:
    """Cohere's documented error body."""
    return {"message": err.message}


EXACT = "="  # an ERROR_FORMATTERS key "=/path" matches that path only (what each mounted route records)
# Error shape name (``Route.errors``) -> body builder.
ERROR_FORMATS = {"openai": openai_error_body, "cohere": cohere_error_body}


class HTTPError(PoolgateError):
    """One of aiohttp's own HTTP exceptions, seen as a PoolgateError."""

    def __init__(self, exc: web.HTTPException):
        phrase = HTTPStatus(exc.status).phrase
        text = exc.text or ""
        super().__init__(phrase if not text or text.startswith(f"{exc.status}:") else text)
        self.status = exc.status
        self.type = phrase.replace(" ", "").replace("-", "") + "Error"
        self.code = phrase.lower().replace(" ", "_").replace("-", "_")
        self.allow = exc.headers.get("Allow")


@web.middleware
async def edge_middleware(request: web.Request, handler) -> web.StreamResponse:
    request_id = _request_id(request)
    request[REQUEST_ID] = request_id
    telemetry = request.app[TELEMETRY]
    record = request[RECORD] = telemetry.begin(request, request_id)
    error: PoolgateError | None = None
    try:
        _check_api_key(request)
        response = await handler(request)
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
    except Exception:
        log.exception("unhandled error in %s %s (request %s)", request.method, request.path, request_id)
        error = InternalError("Internal server error.")
    if error is not None:
        response = error_response(request, error)
    response.headers[REQUEST_ID_HEADER] = request_id
    if record is not None:
        await _write_and_end(request, response, record, error)
    return response


async def _write_and_end(request: web.Request, response: web.StreamResponse, record, error) -> None:
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


def _check_api_key(request: web.Request) -> None:
    key = request.app[CONFIG].api_key
    if not key or request.method == "OPTIONS" or not request.path.startswith(API_KEY_PREFIXES):
        return
    sent = request.headers.get("Authorization", "")
    if not hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), f"Bearer {key}".encode()):
        raise Unauthorized("Unauthorized: missing or invalid API key.")


def error_response(request: web.Request, err: PoolgateError) -> web.Response:
    """The error body for ``err`` in the shape the request's path calls for."""
    if err.status >= 500 and not (err.status == 503 and request.path in QUIET_503_PATHS):
        log.warning("request %s failed: %s %s", request.get(REQUEST_ID), err.status, err.message)
    formatter = _formatter(request.app[ERROR_FORMATTERS], request.path)
    headers = {"Retry-After": RETRY_AFTER_S} if err.status in RETRY_STATUSES else {}
    if isinstance(err, HTTPError) and err.allow:
        headers["Allow"] = err.allow
    return web.json_response(formatter(err), status=err.status, headers=headers)


def _formatter(formatters: dict, path: str):
    exact = formatters.get(EXACT + path)
    if exact is not None:
        return exact
    prefix = max((p for p in formatters if not p.startswith(EXACT) and path.startswith(p)), key=len, default=None)
    return formatters[prefix] if prefix is not None else openai_error_body
