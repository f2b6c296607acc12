"""``poolgate worker``: one worker started alone (on another host), for a gateway's ``--worker-url``.

It takes the model flags of ``poolgate serve`` (``shared.config.model_flags``), plus
where to listen and how long to drain on SIGTERM, and runs ``workers.main.run``:
the same path as a worker the gateway spawns, without the parent-death signal,
so it outlives the shell that started it. This module imports without torch;
torch loads with the model.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from poolgate.shared.config.flags import positive_float
from poolgate.shared.config.frozen import WORKER_DRAIN_TIMEOUT_S
from poolgate.shared.config.model_flags import add_model_arguments, worker_config_from_args
from poolgate.shared.config.security_flags import add_worker_security_arguments, worker_security_from_args
from poolgate.shared.config.tracing_flags import add_tracing_arguments, tracing_config_from_args, with_worker_tracing
from poolgate.shared.wire.transport import parse_address

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def listen_address(text: str) -> str:
    try:
        parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--listen", type=listen_address, default="tcp://127.0.0.1:8001",
                   help="where the gateway reaches this worker: tcp://host:port (tcp://0.0.0.0:PORT for "
                        "other hosts) or unix:/path/to.sock")
    p.add_argument("--drain-timeout", type=positive_float, default=WORKER_DRAIN_TIMEOUT_S, metavar="SECONDS",
                   help="on SIGTERM, seconds the calls in flight may take to finish before the worker stops anyway "
                        "(new calls are refused at once, so the gateway sends them elsewhere); under Kubernetes keep "
                        "terminationGracePeriodSeconds above this plus the preStop sleep")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO")
    p.add_argument("--runner-factory", default=None, help=argparse.SUPPRESS)  # module:function, for tests
    add_tracing_arguments(p)
    add_worker_security_arguments(p)


def main(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; exit codes as ``workers.main.run`` (2 also for a missing model)."""
    try:
        cfg = with_worker_tracing(worker_config_from_args(args), tracing_config_from_args(args, os.environ))
        cfg = replace(cfg, security=worker_security_from_args(args, os.environ), drain_timeout_s=args.drain_timeout)
    except (OSError, ValueError) as exc:
        print(f"poolgate worker: error: {exc}", file=sys.stderr)
        return 2
    from poolgate.workers.main import DEFAULT_RUNNER_FACTORY, run

    return run(cfg, args.listen, args.runner_factory or DEFAULT_RUNNER_FACTORY, log_level=args.log_level)
