"""Detailed traces (``--collect-detailed-traces``): a finished call's child spans, from the engine's own clock readings.

For each call the engine finishes, ``CallSpans.trace`` makes its child spans
under the gateway's ``llm_request`` span (whose context travels in
``TokenCall.trace_context``), after the gateway's own ``tokenize`` child span
(``gateway.telemetry.tracing``: the worker no longer tokenizes):

- ``queue``: its sequences waiting in the scheduler, until its first batch
  starts executing;
- ``forward`` and ``pool``, once per batch the call ran in: the runner's own
  readings of the model's forward and of the pooling (method, head, copy back
  to the host). With detailed traces on, the runner waits for the device
  between the two, so each is its own time; that wait is the price of them.

The engine reads ``time.perf_counter``; one offset, taken when the tracer is
built, turns those readings into epoch nanoseconds. A call that carries no
trace context (its gateway does not trace) gets no spans: there is no trace
to join. Failed calls get none either. No tracer (tracing off) costs the
engine one ``is None`` test per call.
"""
from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from poolgate.shared.telemetry import names
from poolgate.shared.config.frozen import TracingConfig
from poolgate.shared.telemetry.trace_export import ExportingTracer
from poolgate.shared.wire.token_call import TokenCall

PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION = "poolgate.worker"


class CallSpans(ExportingTracer):
    """The engine's ``CallTracer``: exports the child spans of every traced call."""

    def __init__(self, cfg: TracingConfig):
        super().__init__(cfg, INSTRUMENTATION)
        self._offset_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter ns -> epoch ns

    def trace(self, call: TokenCall, queued: float, started: float, steps: list[tuple[str, float, float]]) -> None:
        """Spans for one call; the times are perf_counter seconds."""
        parent = PROPAGATOR.extract(call.trace_context)
        if not trace.get_current_span(parent).get_span_context().is_valid:
            return
        for name, start, end in [("queue", queued, started), *steps]:
            span = self.tracer.start_span(name, context=parent, start_time=self._epoch_ns(start),
                                           attributes={names.ATTR_REQUEST_ID: call.request_id})
            span.end(end_time=self._epoch_ns(end))

    def _epoch_ns(self, perf_s: float) -> int:
        return self._offset_ns + int(perf_s * 1e9)
