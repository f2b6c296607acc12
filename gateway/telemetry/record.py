"""Per-request telemetry: one ``RequestRecord`` per API request, filled on the way, ended once.

The middleware calls ``Telemetry.begin`` when a request arrives and
``Telemetry.end`` after its response is written. In between, the serving path
and the dialect fill the record (model, task, lane, backend, tokens, the
input's modalities and media count, the worker's queue and inference times,
encoding formats, dimensions). ``end`` hands the
record to the metrics (``gateway.telemetry.metrics``) and to the tracer
(``gateway.telemetry.tracing``); either may be off, and with both off a request costs
one small object. The middleware begins a record only for a route marked
``recorded`` (``dialects.route.Route``): ops routes (health, metrics, version,
model list) are not, as vLLM does not record them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from poolgate.shared.domain.errors import PoolgateError

UNMATCHED_ROUTE = "unmatched"  # the route label of a 404, so unknown paths add no label values


@dataclass
class RequestRecord:
    """What one request did; read by the metrics and the tracer when it ends."""

    request_id: str
    route: str  # the route's pattern, e.g. "/v1/embeddings"
    arrival_ns: int  # wall clock at arrival (the span's start)
    started: float  # perf_counter at arrival
    model: str | None = None
    task: str | None = None
    backend: str | None = None
    prompt_tokens: int | None = None
    characters: int | None = None  # of the inputs the serving path ran (``x-compute-characters``)
    modalities: tuple[str, ...] = ()  # what its inputs hold: text, image, audio (``gateway.serving.modalities``)
    media: dict[str, int] = field(default_factory=dict)  # its images and audio clips by kind (none: empty)
    tokenize_s: float | None = None
    tokenize_ns: tuple[int, int] | None = None  # wall clock: its inputs waited for and ran in the tokenizer pool
    queue_s: float | None = None
    inference_s: float | None = None
    encoding_formats: tuple[str, ...] = ()
    dimension_count: int | None = None
    response_id: str | None = None  # the id in the response body, set by the dialect
    status: int = 0
    error_type: str | None = None  # the error's code (e.g. "invalid_request"); None on success
    reason: str | None = None  # why a 429 was refused (``Overloaded.reason``, e.g. "queue_full")
    tenant: str | None = None  # the caller's tenant name (``gateway.http.tenants``); None: no key needed
    lane: str | None = None  # "live" or "bulk" (``X-Poolgate-Lane``) once the serving path read it
    protocol: str = "http"  # "http", or "grpc" for a gRPC call (gateway.grpc): its route is the full method name
    grpc_code: int | None = None  # a gRPC call's status code (``grpc.StatusCode`` value), once it ended
    duration_s: float = 0.0
    span: Any = None  # the tracer's handle on the llm_request span
    trace_context: dict[str, str] = field(default_factory=dict)  # W3C headers to carry to the worker


class Tracer(Protocol):
    """``gateway.telemetry.tracing``: the llm_request span of a record."""

    def start(self, record: RequestRecord, headers: Mapping[str, str]) -> None: ...

    def end(self, record: RequestRecord) -> None: ...


class Recorder(Protocol):
    """``gateway.telemetry.metrics``: what a finished request adds to the Prometheus metrics."""

    def observe(self, record: RequestRecord) -> None: ...


class Telemetry:
    """The tracer and the metrics recorder of one app (each None when off)."""

    def __init__(self, tracer: Tracer | None = None, recorder: Recorder | None = None):
        self.tracer, self.recorder = tracer, recorder

    def begin(self, request: web.Request, request_id: str) -> RequestRecord:
        """A record for a recorded route's request (always: the timing headers read it, ``http.timings``,
        whether or not metrics and tracing are on)."""
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else UNMATCHED_ROUTE
        return self.open(route, request_id, request.headers)

    def open(self, route: str, request_id: str, headers: Mapping[str, str], protocol: str = "http") -> RequestRecord:
        """A record for one request on ``route`` (an HTTP route's pattern, or a gRPC call's full method name),
        its span's parent read from ``headers`` (W3C trace context)."""
        record = RequestRecord(
            request_id=request_id,
            route=route,
            arrival_ns=time.time_ns(),
            started=time.perf_counter(),
            protocol=protocol,
        )
        if self.tracer is not None:
            self.tracer.start(record, headers)
        return record

    def end(self, record: RequestRecord, status: int, error: PoolgateError | None) -> None:
        record.status = status
        record.error_type = error.code if error is not None else None
        record.reason = getattr(error, "reason", None)
        record.duration_s = time.perf_counter() - record.started
        if self.recorder is not None:
            self.recorder.observe(record)
        if self.tracer is not None:
            self.tracer.end(record)
