"""An OpenTelemetry tracer on a provider of our own, exporting over OTLP, built from one TracingConfig.

The gateway (the ``llm_request`` spans, ``gateway.telemetry.tracing``) and a worker
(the detailed child spans, ``workers.engine.tracing``) each build one: both are
``ExportingTracer``s. It is never made the global
provider, so nothing else in the process (a library's own instrumentation)
exports through it by accident. Everything comes from the config, which the
CLI filled from its flags and the OTEL_* variables; the SDK still reads its
own tuning variables (``OTEL_BSP_*``, TLS files); the export timeout is ours
(``EXPORT_TIMEOUT_S``). The gRPC exporter is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlparse

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    ParentBasedTraceIdRatio,
    Sampler,
    TraceIdRatioBased,
)

from poolgate.shared.config.frozen import OtlpProtocol, TracingConfig

DEFAULT_RATIO = 1.0  # the SDK's default when OTEL_TRACES_SAMPLER_ARG is not set
# One export (retries included) gives up after this, so a flush at shutdown with an unreachable
# collector ends well before a worker's stop grace period (10 s) turns into SIGKILL.
EXPORT_TIMEOUT_S = 5

# OTEL_TRACES_SAMPLER name -> the sampler, given OTEL_TRACES_SAMPLER_ARG (used by the ratio ones)
SAMPLERS: dict[str, Callable[[float], Sampler]] = {
    "always_on": lambda _: ALWAYS_ON,
    "always_off": lambda _: ALWAYS_OFF,
    "traceidratio": TraceIdRatioBased,
    "parentbased_always_on": lambda _: DEFAULT_ON,
    "parentbased_always_off": lambda _: DEFAULT_OFF,
    "parentbased_traceidratio": ParentBasedTraceIdRatio,
}
RATIO_SAMPLERS = frozenset({"traceidratio", "parentbased_traceidratio"})


def _http_exporter(cfg: TracingConfig) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=cfg.endpoint, headers=dict(cfg.headers), timeout=EXPORT_TIMEOUT_S)


def _grpc_exporter(cfg: TracingConfig) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    # TLS follows the scheme, as the SDK does for its own endpoint variable: https:// is secure.
    return OTLPSpanExporter(
        endpoint=cfg.endpoint,
        headers=cfg.headers or None,
        insecure=urlparse(cfg.endpoint).scheme != "https",
        timeout=EXPORT_TIMEOUT_S,
    )


# OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL value -> the exporter for it
EXPORTERS: dict[OtlpProtocol, Callable[[TracingConfig], SpanExporter]] = {
    "http/protobuf": _http_exporter,
    "grpc": _grpc_exporter,
}


def sampler(cfg: TracingConfig) -> Sampler:
    return SAMPLERS[cfg.sampler](DEFAULT_RATIO if cfg.sampler_arg is None else cfg.sampler_arg)


def build_provider(cfg: TracingConfig) -> TracerProvider:
    """A provider for ``cfg`` whose spans go through a BatchSpanProcessor to ``cfg``'s OTLP
    exporter. Shut it down to flush what is still queued."""
    provider = TracerProvider(
        sampler=sampler(cfg), resource=Resource({SERVICE_NAME: cfg.service_name}), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(EXPORTERS[cfg.protocol](cfg)))
    return provider


class ExportingTracer:
    """``tracer`` makes the spans; ``force_flush`` exports the ended ones now; ``shutdown`` flushes and stops."""

    def __init__(self, cfg: TracingConfig, instrumentation: str):
        self.provider = build_provider(cfg)
        self.tracer = self.provider.get_tracer(instrumentation)

    def force_flush(self, timeout_ms: int = 30_000) -> bool:
        return self.provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        self.provider.shutdown()
