"""A batch's OpenTelemetry spans: one ``batch_job`` span per run, a ``batch_chunk`` span per 1,000 lines sent.

When tracing is on, each run of a batch (a restart resumes it in a new
run, and a new trace) opens a ``batch_job`` span (kind INTERNAL: the batch's
id, endpoint, tenant, and at the end its status and request counts). Lines
are grouped by the order they are sent into chunks of ``CHUNK_LINES``; each
chunk is a ``batch_chunk`` child span, open from its first line's send to its
last line's end, and every line of it is sent with the chunk's
``traceparent``, so the line's own ``llm_request`` span (opened by the
gateway's middleware like any request's, ``gateway.telemetry.tracing``) is
the chunk's child. A trace of a batch then reads: the job, its chunks, and
under each its lines with their tokenize, queue and forward spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from poolgate.gateway.jobs.lines import Line

CHUNK_LINES = 1000
JOB_SPAN, CHUNK_SPAN = "batch_job", "batch_chunk"
ATTR_BATCH_ID = "poolgate.batch.id"
ATTR_ENDPOINT = "poolgate.batch.endpoint"
ATTR_TENANT = "poolgate.batch.tenant"
ATTR_STATUS = "poolgate.batch.status"
ATTR_CHUNK = "poolgate.batch.chunk"
PROPAGATOR = TraceContextTextMapPropagator()


@dataclass
class _Chunk:
    span: Span
    headers: dict[str, str]
    sent: int = 0
    pending: int = 0


@dataclass
class JobSpans:
    """The spans of one run of a batch (module doc); ``tracer``: an OpenTelemetry tracer."""

    tracer: Any
    batch: dict[str, Any]
    chunk_lines: int = CHUNK_LINES
    _job: Span | None = None
    _chunks: list[_Chunk] = field(default_factory=list)
    _of_line: dict[int, _Chunk] = field(default_factory=dict)

    def __post_init__(self) -> None:
        attributes = {
            ATTR_BATCH_ID: self.batch["id"],
            ATTR_ENDPOINT: self.batch["endpoint"],
            ATTR_TENANT: self.batch["owner"],
        }
        self._job = self.tracer.start_span(JOB_SPAN, kind=SpanKind.INTERNAL, attributes=attributes)

    def headers(self, line: Line) -> dict[str, str]:
        """The ``traceparent`` (and ``tracestate``) of the chunk ``line`` is sent in."""
        chunk = self._of_line.get(line.number)
        if chunk is None:
            last = self._chunks[-1] if self._chunks else None
            chunk = last if last is not None and last.sent < self.chunk_lines else self._open()
            chunk.sent += 1
            chunk.pending += 1
            self._of_line[line.number] = chunk
        return chunk.headers

    def _open(self) -> _Chunk:
        context = trace.set_span_in_context(self._job) if self._job is not None else None
        span = self.tracer.start_span(CHUNK_SPAN, context=context, attributes={ATTR_CHUNK: len(self._chunks)})
        headers: dict[str, str] = {}
        PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
        self._chunks.append(_Chunk(span, headers))
        return self._chunks[-1]

    def finished(self, number: int) -> None:
        """Line ``number`` is written: its chunk ends with its last line."""
        chunk = self._of_line.pop(number, None)
        if chunk is None:
            return
        chunk.pending -= 1
        if chunk.pending == 0 and chunk.sent >= self.chunk_lines:
            chunk.span.end()

    def end(self, status: str, counts: dict[str, Any], error: str | None = None) -> None:
        """End the chunks still open (their lines dropped by a cancel or a stop) and the job's span."""
        for chunk in self._chunks:
            if chunk.pending or chunk.sent < self.chunk_lines:
                chunk.span.end()
        self._chunks.clear()
        self._of_line.clear()
        if self._job is None:
            return
        counted = {f"poolgate.batch.{k}": v for k, v in counts.items() if v is not None}
        self._job.set_attributes({ATTR_STATUS: status, **counted})
        if error is not None:
            self._job.set_status(Status(StatusCode.ERROR, error))
        self._job.end()
        self._job = None
