"""``poolgate serve``: its flags, parsed once into a frozen GatewayConfig, then ``run_gateway``."""
from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping

from poolgate.gateway.launch import run_gateway
from poolgate.shared.config import GatewayConfig
from poolgate.shared.model_flags import add_model_arguments, port_number, positive_int, worker_config_from_args
from poolgate.shared.tracing_flags import add_tracing_arguments, tracing_config_from_args, with_worker_tracing

log = logging.getLogger("poolgate")


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument("--auto-truncate", action="store_true",
                   help="truncate over-long inputs instead of rejecting them with 400")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 and /v2 routes")
    p.add_argument("--workers", type=positive_int, default=1, help="local worker processes for the model")
    p.add_argument("--transport", choices=("unix", "tcp"), default="unix", help="gateway<->local worker transport")
    p.add_argument("--worker-url", action="append", default=[],
                   help="a running worker (poolgate worker) to use instead of spawning one: "
                        "tcp://host:port or unix:/path; the model flags are then ignored")
    p.add_argument("--startup-timeout", type=positive_float, default=600.0,
                   help="seconds a worker may take to load and report ready")
    p.add_argument("--max-inputs-per-request", type=positive_int, default=2048,
                   help="inputs one request may carry (OpenAI's limit is 2048)")
    p.add_argument("--request-timeout", type=positive_float, default=600.0,
                   help="seconds before an unfinished request gets 504 and is cancelled in the worker")
    p.add_argument("--max-in-flight-per-worker", type=positive_int, default=None,
                   help="calls in flight per worker before new ones get 429 (default: no cap)")
    p.add_argument("--metrics-port", type=port_number, default=None,
                   help="serve Prometheus /metrics on this port instead of the API port")
    p.add_argument("--no-metrics", dest="metrics", action="store_false",
                   help="no Prometheus metrics (and no /metrics route)")
    p.add_argument("--log-level", default="INFO")
    add_tracing_arguments(p)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> GatewayConfig:
    tracing = tracing_config_from_args(args, environ)
    worker = None if args.worker_url else with_worker_tracing(worker_config_from_args(args), tracing)
    workers = () if worker is None else (worker,) * args.workers
    return GatewayConfig(
        host=args.host, port=args.port, api_key=args.api_key, auto_truncate=args.auto_truncate,
        transport=args.transport, worker_urls=tuple(args.worker_url), workers=workers,
        startup_timeout_s=args.startup_timeout, max_inputs_per_request=args.max_inputs_per_request,
        request_timeout_s=args.request_timeout, max_in_flight_per_worker=args.max_in_flight_per_worker,
        tracing=tracing,
        metrics=args.metrics, metrics_port=args.metrics_port,
    )


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except (FileNotFoundError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    return run_gateway(config)
