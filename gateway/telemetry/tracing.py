"""The ``llm_request`` span of each API request: opened on arrival, filled from its record, ended once.

vLLM's span (``vllm/v1/engine/output_processor.py::do_tracing``): named
``llm_request``, kind SERVER, starting at the request's arrival, its parent
taken from the incoming W3C ``traceparent``/``tracestate`` headers. ``start``
also writes the span's own context into ``record.trace_context``, which the
serving path sends to the worker inside the ``PoolingCall``, so the worker's
detailed child spans (``workers.engine.tracing``) join the same trace.

``end`` sets vLLM's attributes (request id, prompt tokens, e2e / queue /
inference latency) and the GenAI semantic conventions for embeddings
(operation, provider, models, the response body's id, input tokens, encoding
formats, dimensions) plus ``http.route`` and ``http.response.status_code`` (a gRPC
call: ``rpc.system``, ``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``), and
poolgate's own ``poolgate.lane`` (``live`` or ``bulk``, once the serving path
read the request's ``X-Poolgate-Lane``), ``poolgate.input.modalities`` (what
its inputs hold: ``text``, ``image``, ``text,image``, ``audio``...) and
``poolgate.input.media_count`` (its images and audio clips). A request
that failed gets ``error.type`` (the error's code, e.g.
``context_length_exceeded``); only a 5xx sets the span's status to ERROR, as
the HTTP server convention says. A request that failed before it was routed
(a bad body, an unknown model) has no task, so its span has no
``gen_ai.operation.name`` and no model: we do not guess them from the route.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from poolgate.gateway.telemetry.record import RequestRecord
from poolgate.shared.config.frozen import TracingConfig
from poolgate.shared.telemetry import names
from poolgate.shared.telemetry.trace_export import ExportingTracer

PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION = "poolgate.gateway"


class SpanTracer(ExportingTracer):
    """The gateway's ``Tracer`` (``gateway.telemetry.record``) over its own OpenTelemetry provider."""

    def __init__(self, cfg: TracingConfig):
        super().__init__(cfg, INSTRUMENTATION)
        self.detailed = cfg.detailed  # --collect-detailed-traces: the gateway's own child span, "tokenize"

    def start(self, record: RequestRecord, headers: Mapping[str, str]) -> None:
        span = self.tracer.start_span(
            names.SPAN_NAME,
            context=PROPAGATOR.extract(headers),
            kind=SpanKind.SERVER,
            start_time=record.arrival_ns,
            attributes={names.ATTR_PROVIDER: names.PROVIDER, **_where(record)},
        )
        record.span = span
        PROPAGATOR.inject(record.trace_context, context=trace.set_span_in_context(span))

    def end(self, record: RequestRecord) -> None:
        span = record.span
        if span is None:
            return
        span.set_attributes(span_attributes(record))
        if self.detailed and record.tokenize_ns is not None:  # the workers' child spans follow it (queue, ...)
            child = self.tracer.start_span(
                "tokenize",
                context=trace.set_span_in_context(span),
                start_time=record.tokenize_ns[0],
                attributes={names.ATTR_REQUEST_ID: record.request_id},
            )
            child.end(end_time=record.tokenize_ns[1])
        if record.status >= 500:
            span.set_status(Status(StatusCode.ERROR, record.error_type))
        span.end()


def build_tracer(cfg: TracingConfig) -> SpanTracer:
    return SpanTracer(cfg)


def _where(record: RequestRecord) -> dict[str, str]:
    """An HTTP request's ``http.route``; a gRPC call's ``rpc.system``, ``rpc.service`` and ``rpc.method``."""
    if record.protocol != "grpc":
        return {names.ATTR_HTTP_ROUTE: record.route}
    service, _, method = record.route.strip("/").rpartition("/")
    return {names.ATTR_RPC_SYSTEM: "grpc", names.ATTR_RPC_SERVICE: service, names.ATTR_RPC_METHOD: method}


def span_attributes(record: RequestRecord) -> dict[str, object]:
    """The attributes a finished request's span gets; those not known for it are left out."""
    attrs: dict[str, object] = {names.ATTR_REQUEST_ID: record.request_id, names.ATTR_E2E: record.duration_s}
    if record.protocol == "grpc":
        attrs[names.ATTR_RPC_GRPC_STATUS] = record.grpc_code if record.grpc_code is not None else 0
    else:
        attrs[names.ATTR_HTTP_STATUS] = record.status
    optional = {
        names.ATTR_OPERATION: names.OPERATIONS.get(record.task) if record.task else None,
        names.ATTR_MODEL: record.model,
        names.ATTR_RESPONSE_MODEL: record.model if record.status < 400 else None,
        names.ATTR_RESPONSE_ID: record.response_id,
        names.ATTR_PROMPT_TOKENS: record.prompt_tokens,
        names.ATTR_INPUT_TOKENS: record.prompt_tokens,
        names.ATTR_TIME_IN_QUEUE: record.queue_s,
        names.ATTR_TIME_IN_INFERENCE: record.inference_s,
        names.ATTR_ENCODING_FORMATS: list(record.encoding_formats) or None,
        names.ATTR_DIMENSION_COUNT: record.dimension_count,
        names.ATTR_ERROR_TYPE: record.error_type,
        names.ATTR_LANE: record.lane,
        names.ATTR_MODALITIES: ",".join(record.modalities) or None,
        names.ATTR_MEDIA_COUNT: sum(record.media.values()) if record.modalities else None,
    }
    attrs.update((k, v) for k, v in optional.items() if v is not None)
    return attrs
