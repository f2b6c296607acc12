"""Detailed traces (``--collect-detailed-traces``): a finished call's child spans, from the engine's own clock readings.

For each call the engine finishes, ``CallSpans.trace`` makes four spans,
back to back, under the gateway's ``llm_request`` span (its context travels
in ``PoolingCall.trace_context``):

- ``tokenize``: the call's inputs tokenized (in the tokenizer pool);
- ``queue``: its sequences waiting in the scheduler, until its first batch
  starts executing;
- ``forward``: from its first batch's execute start to its last batch's end.
  The runner's ``execute`` is one device step (forward, pooling method, head,
  copy back to the host), so this span covers all of it: splitting it would
  mean waiting on the device inside the batch;
- ``pool``: gathering the call's rows into its one output block and handing
  it back to the call, until the call is complete.

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

from poolgate.shared import telemetry as names
from poolgate.shared.config import TracingConfig
from poolgate.shared.trace_export import ExportingTracer
from poolgate.shared.wire import PoolingCall

PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION = "poolgate.worker"


class CallSpans(ExportingTracer):
    """The engine's ``CallTracer``: exports the child spans of every traced call."""

    def __init__(self, cfg: TracingConfig):
        super().__init__(cfg, INSTRUMENTATION)
        self._offset_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter ns -> epoch ns

    def trace(self, call: PoolingCall, tokenize_start: float, queued: float, started: float,
              finished: float, done: float) -> None:
        """Spans for one call; the times are perf_counter seconds, in this order."""
        parent = PROPAGATOR.extract(call.trace_context)
        if not trace.get_current_span(parent).get_span_context().is_valid:
            return
        edges = [self._epoch_ns(t) for t in (tokenize_start, queued, started, finished, done)]
        for name, start, end in zip(names.CHILD_SPANS, edges, edges[1:]):
            span = self.tracer.start_span(name, context=parent, start_time=start,
                                           attributes={names.ATTR_REQUEST_ID: call.request_id})
            span.end(end_time=end)

    def _epoch_ns(self, perf_s: float) -> int:
        return self._offset_ns + int(perf_s * 1e9)
