"""One gRPC call as the HTTP middleware would have it: request id, API key and tenant, deadline, record, errors.

A gRPC method runs the same serving path as an HTTP route (``gateway.serving``),
through a ``CallScope``: what that path reads of an aiohttp request (the app,
the headers, per-request state). The call's metadata are its headers (binary
``-bin`` keys left out): ``authorization: Bearer KEY`` picks the tenant exactly
as on HTTP (``http.middleware.caller``), ``traceparent`` parents the
``llm_request`` span, ``x-request-id`` names the call, ``x-poolgate-lane`` and
``x-request-timeout`` work as the HTTP headers do. gRPC's own deadline is the
request's deadline: the time the client has left becomes ``X-Request-Timeout``
(the shorter, when it sent both), a little later (``DEADLINE_GRACE_S``) so that
gRPC's own end of the call at the deadline comes first.

``GrpcCall`` is the middleware's part: ``enter`` authenticates and admits the
call against its tenant's quotas (once per call; a stream is one call, its
tokens charged per batch as they are counted), ``leave`` ends that;
``record``/``end`` open and close a telemetry record (one per unary call, one
per batch a stream serves) labelled ``protocol="grpc"`` with the full method
name as its route. ``fail`` turns any exception into the call's status
(``gateway.grpc.status``: one table) after ending the record, as the
middleware turns it into an error body.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, NoReturn

import grpc
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from poolgate.gateway.grpc.status import HTTP_OF, code_of, trailers
from poolgate.gateway.http.middleware import MAX_REQUEST_ID_CHARS, caller
from poolgate.gateway.http.state import RECORD, REQUEST_ID, TELEMETRY, TENANT, TENANTS
from poolgate.gateway.http.tenants import TenantState
from poolgate.gateway.http.timings import timing_headers
from poolgate.gateway.scope import CallScope
from poolgate.gateway.serving import TIMEOUT_HEADER
from poolgate.gateway.telemetry.record import RequestRecord
from poolgate.shared.domain.errors import ClientClosedRequest, InternalError, PoolgateError
from poolgate.shared.telemetry.log_limit import LogLimiter

log = logging.getLogger(__name__)
_failures = LogLimiter(log)
MIN_TIMEOUT_S = 0.001  # a deadline already past still makes a positive timeout: the call then fails as late
# gRPC ends a call at its deadline on both sides (the client's DEADLINE_EXCEEDED; here, the call cancelled, and
# with it its work in the pools); the serving path's deadline is this much later, a backstop that never races it
DEADLINE_GRACE_S = 0.25


def call_headers(metadata: Any, time_remaining: float | None) -> CIMultiDictProxy[str]:
    """A call's metadata as headers, its deadline as ``X-Request-Timeout`` (module doc)."""
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in metadata or ():
        if not key.endswith("-bin") and isinstance(value, str):
            headers.add(key, value)
    if time_remaining is not None:
        left = max(time_remaining + DEADLINE_GRACE_S, MIN_TIMEOUT_S)
        try:
            sent = float(headers.get(TIMEOUT_HEADER, "inf"))
        except ValueError:
            sent = float("inf")  # not a number: gRPC's deadline stands (the header's own check is HTTP's)
        headers[TIMEOUT_HEADER] = f"{min(left, sent) if sent > 0 else left:.6f}"
    return CIMultiDictProxy(headers)


class GrpcCall:
    """The middleware's part of one gRPC call (module doc)."""

    def __init__(self, app: web.Application, context: grpc.aio.ServicerContext, method: str) -> None:
        self.app, self.context, self.method = app, context, method
        self.metadata = context.invocation_metadata()
        self.headers = call_headers(self.metadata, context.time_remaining())
        sent = self.headers.get("x-request-id", "")
        ok = 0 < len(sent) <= MAX_REQUEST_ID_CHARS and sent.isascii() and sent.isprintable()
        self.request_id = sent if ok else uuid.uuid4().hex
        self.tenant: TenantState | None = None
        self._batches = 0

    def scope(self) -> CallScope:
        """A scope for one serving-path request of this call: the call's own id, else ``ID-N`` per batch."""
        if self._batches:  # a stream's later batch: the time the call has left now (its deadline is the call's)
            self.headers = call_headers(self.metadata, self.context.time_remaining())
        scope = CallScope(self.app, self.headers)
        scope[REQUEST_ID] = self.request_id if self._batches == 0 else f"{self.request_id}-{self._batches}"
        self._batches += 1
        scope[TENANT] = self.tenant
        scope[RECORD] = None
        return scope

    def enter(self, scope: CallScope) -> None:
        """Authenticate and admit the call (401, 403, 429 as on HTTP); ``scope``: the call's first."""
        if self.app[TENANTS].enabled:
            tenant = caller(scope)
            if (record := scope.get(RECORD)) is not None:
                record.tenant = tenant.name
            tenant.admit()
            self.tenant = scope[TENANT] = tenant

    def leave(self) -> None:
        if self.tenant is not None:
            self.tenant.leave()
            self.tenant = None

    def record(self, scope: CallScope) -> RequestRecord:
        """Open ``scope``'s telemetry record."""
        record = self.app[TELEMETRY].open(self.method, scope[REQUEST_ID], self.headers, protocol="grpc")
        if self.tenant is not None:
            record.tenant = self.tenant.name
        scope[RECORD] = record
        return record

    def end(self, scope: CallScope, error: PoolgateError | None = None, code: grpc.StatusCode | None = None) -> None:
        """Close ``scope``'s record (if open) with ``error`` (None: served; ``code``: a status not from an error)."""
        record: RequestRecord | None = scope.get(RECORD)
        if record is None:
            return
        scope[RECORD] = None
        final = code if code is not None else grpc.StatusCode.OK if error is None else code_of(error)
        record.grpc_code = final.value[0]
        status = error.status if error is not None else HTTP_OF.get(final, 500)
        self.app[TELEMETRY].end(record, status, error)

    def served_metadata(self, scope: CallScope) -> None:
        """A unary answer's trailing metadata: its id and TEI's timing headers."""
        record: RequestRecord | None = scope.get(RECORD)
        timings = timing_headers(record) if record is not None else {}
        self.context.set_trailing_metadata((("x-request-id", scope[REQUEST_ID]), *timings.items()))

    async def fail(self, scope: CallScope | None, exc: BaseException) -> NoReturn:
        """End the call with ``exc``'s status (module doc); a cancelled call ends its record as a 499."""
        if isinstance(exc, asyncio.CancelledError):
            if scope is not None:
                self.end(scope, ClientClosedRequest("client cancelled the call"), grpc.StatusCode.CANCELLED)
            raise exc
        err = exc if isinstance(exc, PoolgateError) else None
        if err is None:
            _failures.log(
                logging.ERROR,
                ("unhandled", self.method, type(exc)),
                "unhandled error in %s (request %s)",
                self.method,
                self.request_id,
                exc_info=exc,
            )
            err = InternalError("Internal server error.")
        if scope is not None:
            self.end(scope, err)
        elif err.status >= 500:
            log.warning("call %s failed: %s %s", self.request_id, err.status, err.message)
        await self.context.abort(code_of(err), err.message, trailing_metadata=trailers(err, self.request_id))
        raise AssertionError("abort returns only by raising")  # pragma: no cover
