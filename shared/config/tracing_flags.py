"""The TracingConfig of ``poolgate serve`` / ``poolgate worker``, from their tracing flags and the OTEL_* variables.

Flags as vLLM's: ``--otlp-traces-endpoint URL`` turns tracing on and
``--collect-detailed-traces`` adds the worker's child spans (it needs an
endpoint). The standard OpenTelemetry variables fill the rest, read here and
nowhere below:

- the endpoint, when the flag is absent: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
  as given, else ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a base URL: ``/v1/traces`` is
  appended for http/protobuf, as the SDK does);
- ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``:
  ``http/protobuf`` (our default, port 4318) or ``grpc`` (port 4317);
- ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` / ``OTEL_EXPORTER_OTLP_HEADERS``
  (``k=v,k2=v2``, values URL-encoded);
- ``OTEL_SERVICE_NAME`` (default ``poolgate``), ``OTEL_TRACES_SAMPLER`` and
  ``OTEL_TRACES_SAMPLER_ARG``.

A bad value is a ValueError with the variable's name, so the command exits 2
before anything starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace
from urllib.parse import unquote

from poolgate.shared.config.frozen import OTLP_PROTOCOLS, TracingConfig, WorkerConfig
from poolgate.shared.telemetry.trace_export import RATIO_SAMPLERS, SAMPLERS

HTTP_TRACES_PATH = "/v1/traces"


def add_tracing_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("tracing (OpenTelemetry; the OTEL_* variables are read too)")
    g.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        metavar="URL",
        help="export spans to this OTLP collector (serve: one llm_request span per request), e.g. "
        "http://localhost:4318/v1/traces (http/protobuf, the default) or http://localhost:4317 "
        "with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "
        "then OTEL_EXPORTER_OTLP_ENDPOINT; none: no tracing)",
    )
    g.add_argument(
        "--collect-detailed-traces",
        action="store_true",
        help="child spans per request: the gateway's tokenize, the worker's queue, forward and pool",
    )


def tracing_config_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> TracingConfig | None:
    """The TracingConfig the flags and ``environ`` describe; None when no endpoint is set (no tracing)."""
    env = {k: v.strip() for k, v in environ.items() if k.startswith("OTEL_") and v.strip()}
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol not in OTLP_PROTOCOLS:
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL={protocol!r} is not supported; "
            f"use one of {', '.join(OTLP_PROTOCOLS)}"
        )
    endpoint = args.otlp_traces_endpoint or _endpoint_from_env(env, protocol)
    if endpoint is None:
        if args.collect_detailed_traces:
            raise ValueError(
                "--collect-detailed-traces needs --otlp-traces-endpoint (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)"
            )
        return None
    sampler = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").lower()
    if sampler not in SAMPLERS:
        raise ValueError(f"OTEL_TRACES_SAMPLER={sampler!r} is not one of {', '.join(SAMPLERS)}")
    headers = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    return TracingConfig(
        endpoint=endpoint,
        protocol=protocol,
        service_name=env.get("OTEL_SERVICE_NAME", "poolgate"),
        sampler=sampler,
        sampler_arg=_sampler_arg(env.get("OTEL_TRACES_SAMPLER_ARG"), sampler),
        headers=parse_headers(headers),
        detailed=args.collect_detailed_traces,
    )


def _endpoint_from_env(env: dict[str, str], protocol: str) -> str | None:
    if "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in env:
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if base is None or protocol != "http/protobuf":
        return base
    return base.rstrip("/") + HTTP_TRACES_PATH


def _sampler_arg(text: str | None, sampler: str) -> float | None:
    if text is None or sampler not in RATIO_SAMPLERS:
        return None
    try:
        ratio = float(text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a ratio between 0 and 1")
    return ratio


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` (values URL-encoded, the OTLP exporters' format) as pairs; keys lower-cased for gRPC."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"OTEL_EXPORTER_OTLP_(TRACES_)HEADERS: {item!r} is not key=value")
        pairs.append((unquote(key.strip()).lower(), unquote(value.strip())))
    return tuple(pairs)


def with_worker_tracing(cfg: WorkerConfig, tracing: TracingConfig | None) -> WorkerConfig:
    """``cfg`` with ``tracing`` when detailed traces were asked for (a worker has no other spans)."""
    return replace(cfg, tracing=tracing) if tracing is not None and tracing.detailed else cfg
