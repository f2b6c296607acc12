"""``poolgate serve``: its flags (or ``--config FILE``), parsed once into a frozen GatewayConfig, then ``run_gateway``.

The flags describe one model (a one-entry config); ``--config`` reads a TOML file
with any number of models (``gateway.config.file``). Both go through
``gateway.config.build``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping

from poolgate.gateway.config.build import ModelEntry, config_from_entries
from poolgate.gateway.config.file import load_config
from poolgate.gateway.config.given import given
from poolgate.gateway.launch import run_gateway
from poolgate.shared.config import GatewayConfig
from poolgate.shared.model_flags import add_model_arguments, port_number, positive_int
from poolgate.shared.security_flags import add_gateway_security_arguments
from poolgate.shared.tracing_flags import add_tracing_arguments

log = logging.getLogger("poolgate")


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or a positive number, got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a TOML file with any number of [[models]] (see docs/operations.md); a flag given beside "
        "it overrides the file's value (a model flag: in every [[models]] table)",
    )
    add_model_arguments(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument(
        "--reuse-port",
        action="store_true",
        help="bind the port with SO_REUSEPORT, so several gateway processes (each with --worker-url to "
        "the same `poolgate worker`s) share it and the kernel spreads connections over them",
    )
    p.add_argument(
        "--gateway-processes",
        "--api-server-count",
        dest="gateway_processes",
        type=positive_int,
        default=1,
        metavar="N",
        help="gateway processes on the one port (SO_REUSEPORT) in front of the same workers: this one spawns "
        "and supervises the local workers and N-1 more gateway processes, which connect to them; tenant quotas "
        "and /metrics are shared, admission takes 1/N of each limit per process (see docs/operations.md)",
    )
    p.add_argument(
        "--auto-truncate", action="store_true", help="truncate over-long inputs instead of rejecting them with 400"
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every API and admin route (/health, /ping, "
        "/version, /metrics, /openapi.json and /docs stay open); default: $POOLGATE_API_KEY",
    )
    p.add_argument("--api-key-file", default=None, metavar="FILE", help="read the API key from FILE")
    p.add_argument(
        "--api-keys-file",
        default=None,
        metavar="FILE",
        help="a TOML file of [[tenants]]: name, keys or key_sha256, priority, requests_per_minute, "
        "tokens_per_minute, max_concurrent (see docs/operations.md); any of its keys is accepted "
        "beside --api-key, and a tenant over its quota gets 429 with Retry-After",
    )
    p.add_argument(
        "--model-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder the admin API may load models from (repeatable; none: no loading)",
    )
    p.add_argument(
        "--io-processor-plugin",
        default=None,
        metavar="NAME",
        help="serve /pooling requests whose body has 'data' through this installed IO-processor plugin "
        "(entry point group poolgate.io_processor_plugins)",
    )
    p.add_argument("--workers", type=positive_int, default=1, help="local worker processes for the model")
    p.add_argument("--transport", choices=("unix", "tcp"), default="unix", help="gateway<->local worker transport")
    p.add_argument(
        "--worker-url",
        action="append",
        default=[],
        help="a running worker (poolgate worker) to use instead of spawning one: tcp://host:port, "
        "unix:/path, or dns+tcp://name:port (every address the name resolves to, re-resolved "
        "every 5 s: a Kubernetes headless Service); the model flags are then ignored",
    )
    p.add_argument(
        "--startup-timeout",
        type=positive_float,
        default=600.0,
        help="seconds a worker may take to load and report ready",
    )
    limits = p.add_argument_group("request limits (each over-limit request gets a 4xx naming the limit)")
    limits.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=32 * 1024 * 1024,
        metavar="BYTES",
        help="largest request body; a bigger one gets 413 (default: 32 MiB)",
    )
    limits.add_argument(
        "--max-inputs-per-request",
        type=positive_int,
        default=2048,
        help="inputs one request may carry (OpenAI's limit is 2048)",
    )
    limits.add_argument(
        "--max-chars-per-input",
        type=positive_int,
        default=1_000_000,
        metavar="CHARS",
        help="characters one input may have (a text, both texts of a pair, a chat's contents); "
        "more is a 400 before any tokenizing",
    )
    limits.add_argument(
        "--max-documents-per-rerank",
        type=positive_int,
        default=None,
        metavar="N",
        help="documents one /rerank request may carry (default: --max-inputs-per-request)",
    )
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds before an unfinished request gets 504 and is cancelled in the worker",
    )
    p.add_argument(
        "--max-in-flight-per-worker",
        type=positive_int,
        default=None,
        help="calls in flight per worker before new ones get 429 (default: no cap)",
    )
    p.add_argument(
        "--max-queued-seconds",
        type=non_negative_float,
        default=5.0,
        metavar="SECONDS",
        help="admit work up to this many seconds of a pool's measured capacity (its workers' tokens/s); "
        "more gets 429 with a Retry-After of the time it takes to drain (0 = no limit)",
    )
    p.add_argument(
        "--max-queued-tokens",
        type=positive_int,
        default=None,
        metavar="TOKENS",
        help="admit work up to this many tokens per pool (the estimate scaled by what recent calls counted) "
        "instead of --max-queued-seconds",
    )
    p.add_argument(
        "--drain-timeout",
        type=positive_float,
        default=30.0,
        help="on SIGTERM, seconds the requests in flight may take before the gateway stops anyway",
    )
    p.add_argument(
        "--health-check-interval",
        type=positive_float,
        default=0.25,
        help="seconds between health checks of every worker",
    )
    p.add_argument(
        "--health-check-timeout",
        type=positive_float,
        default=0.75,
        help="a worker that does not answer a health check within this many seconds is taken out "
        "(its calls in flight are retried on another worker)",
    )
    p.add_argument(
        "--metrics-port",
        type=port_number,
        default=None,
        help="serve Prometheus /metrics on this port instead of the API port",
    )
    p.add_argument(
        "--no-metrics", dest="metrics", action="store_false", help="no Prometheus metrics (and no /metrics route)"
    )
    p.add_argument(
        "--allowed-origins",
        action="append",
        default=[],
        metavar="ORIGINS",
        help="answer browsers' CORS preflights and add Access-Control-Allow-Origin for these origins "
        '(repeatable or a comma list, e.g. https://app.example.com; "*": any origin, never with '
        "credentials); default: no CORS headers at all",
    )
    p.add_argument("--log-level", default="INFO")
    add_tracing_arguments(p)
    add_gateway_security_arguments(p)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> GatewayConfig:
    """The GatewayConfig of the flags (one model) or of ``--config``'s file."""
    if args.config is not None:
        parser = argparse.ArgumentParser(add_help=False)
        add_arguments(parser)
        flags = {k: v for k, v in given(args).items() if k not in ("config", "log_level")}
        return load_config(args.config, parser, environ, flags)
    remote = tuple(args.worker_url)
    entry = ModelEntry(args, replicas=0 if remote else args.workers, remotes=remote)
    return config_from_entries(args, [entry], environ)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except (OSError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    return run_gateway(config)
