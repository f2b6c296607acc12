"""The worker process entry point: load one model, serve it on one address until told to stop.

Two entries, one path (``run``): ``poolgate worker MODEL [flags]`` (``workers.cli``)
starts a worker alone, for a gateway on another host; the gateway spawns its own
workers with the private ``python -m poolgate.workers.main --listen unix:/tmp/w.sock
--config - --parent-pid PID`` with the WorkerConfig as JSON on its standard input.

This is the worker's edge: flags and the JSON config are parsed here, once,
and passed down. On Linux the worker asks the kernel for SIGTERM when its
parent dies (``PR_SET_PDEATHSIG``), so a crashed gateway leaves no orphans.
``--runner-factory module:function`` picks what loads the model from the
config (default ``workers.load.build:load_model``, returning a ``LoadedModel``);
tests point it at a fake.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Callable

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.cpu import apply_cpu_class
from poolgate.shared.parent_death import die_with_parent
from poolgate.shared.wire.transport import parse_address
from poolgate.workers.engine.engine import Engine
from poolgate.workers.engine.scheduler import POLICIES
from poolgate.workers.engine.runner_api import LoadedModel
from poolgate.workers.memory import bound_memory
from poolgate.workers.server import bound_address, serve

if TYPE_CHECKING:
    from poolgate.workers.engine.tracing import CallSpans

log = logging.getLogger("poolgate.worker")

DEFAULT_RUNNER_FACTORY = "poolgate.workers.load.build:load_model"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m poolgate.workers.main", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="unix:/path/to.sock or tcp://host:port")
    parser.add_argument("--config", required=True, type=_config_from_json,
                        help="WorkerConfig.to_wire() as JSON, or - to read it from standard input "
                             "(how the gateway passes it, so secrets such as OTLP headers stay out of ps)")
    parser.add_argument("--runner-factory", default=DEFAULT_RUNNER_FACTORY, help="module:function(cfg) -> LoadedModel")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit at once if this is no longer our parent (it died before we started)")
    parser.add_argument("--report-fd", type=int, default=None,
                        help="once listening, write the address served on (a tcp://...:0 listener's real port) "
                             "as one line to this inherited file descriptor, then close it")
    return parser


def _config_from_json(text: str) -> WorkerConfig:
    if text == "-":
        text = sys.stdin.read()
    try:
        return WorkerConfig.from_wire(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"not a WorkerConfig as JSON: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    """The gateway's private spawn entry; exit codes as ``run``'s (argparse errors are 2)."""
    args = build_parser().parse_args(argv)
    die_with_parent(args.parent_pid)
    return run(args.config, args.listen, args.runner_factory, report_fd=args.report_fd)


def run(cfg: WorkerConfig, listen: str, factory_spec: str = DEFAULT_RUNNER_FACTORY, *,
        log_level: str = "INFO", report_fd: int | None = None) -> int:
    """Load ``cfg``'s model with ``factory_spec`` and serve it on ``listen`` until SIGTERM/SIGINT.

    The exit code: 0 stopped cleanly, 1 the model failed to load or serve,
    2 bad arguments (address, factory), 130 interrupted while loading.
    """
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    try:
        parse_address(listen)
        factory = load_factory(factory_spec)
        apply_cpu_class()  # POOLGATE_CPU_CLASS: checked, and torch's ISA caps set before its first kernel
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        log.error("bad worker arguments: %s", exc)
        return 2
    bound_memory()  # before torch loads: workers.memory
    try:
        log.info("loading model %s from %s", cfg.served_model_name, cfg.model)
        model = factory(cfg)
        return asyncio.run(run_worker(cfg, listen, model, report_fd=report_fd))
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, RuntimeError, MemoryError, ImportError) as exc:
        # what a load (a missing or refused checkpoint, torch, an optional library) or the listener raises;
        # anything else is a bug and leaves with its traceback (exit code 1 as well)
        log.error("worker for %s failed: %s", cfg.served_model_name, exc, exc_info=True)
        return 1


def load_factory(spec: str) -> Callable[[WorkerConfig], LoadedModel]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--runner-factory must be module:function, got {spec!r}")
    return getattr(importlib.import_module(module_name), attr)


async def run_worker(cfg: WorkerConfig, address: str, model: LoadedModel, *, report_fd: int | None = None) -> int:
    """Serve ``model`` on ``address`` until SIGTERM or SIGINT, then drain and shut down cleanly.

    Draining: new calls are refused (``Unavailable``: the gateway sends them to
    another worker), the calls in flight finish (up to ``cfg.drain_timeout_s``), then
    the engine stops and fails whatever is left.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    spans = _call_spans(cfg)
    engine = Engine(model, 1, tracer=spans, policy=POLICIES[cfg.batch_policy](),
                    max_queued_tokens=cfg.max_queued_tokens, max_tokens_per_request=cfg.max_tokens_per_request)
    await engine.start()
    draining = asyncio.Event()
    server = await serve(address, engine, engine.info, cfg.security, draining=draining)
    log.info("worker ready: serving %s on %s", model.info.served_model_name, bound_address(server))
    report_address(report_fd, bound_address(server))
    try:
        await stop.wait()
        log.info("stopping worker for %s: draining", model.info.served_model_name)
        draining.set()
        server.close()
        await drain(engine, cfg.drain_timeout_s)
    finally:
        server.close()
        await engine.stop()
        _remove_socket_file(address)
        if spans is not None:
            await asyncio.to_thread(spans.shutdown)
    log.info("worker stopped; %s", pipeline_summary(engine.stats))
    return 0


def report_address(fd: int | None, address: str) -> None:
    """Tell the gateway that spawned us where we serve (``--report-fd``); this line is our "ready"."""
    if fd is not None:
        with os.fdopen(fd, "w") as pipe:
            pipe.write(address + "\n")


async def drain(engine: Engine, timeout_s: float) -> None:
    """Wait until ``engine`` has no call queued or running, or ``timeout_s`` passed."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while _busy(engine.load()):
        if asyncio.get_running_loop().time() >= deadline:
            log.warning("calls still in flight after draining for %ss; stopping anyway", timeout_s)
            return
        await asyncio.sleep(0.05)


def _busy(load: dict) -> bool:
    return bool(load.get("requests_waiting") or load.get("requests_running") or load.get("queued"))


def _call_spans(cfg: WorkerConfig) -> CallSpans | None:
    """With ``--collect-detailed-traces``, the tracer of each call's child spans (``workers.engine.tracing``)."""
    if cfg.tracing is None or not cfg.tracing.detailed:
        return None
    from poolgate.workers.engine.tracing import CallSpans  # the OpenTelemetry SDK loads only when tracing is on

    log.info("detailed traces to %s (%s)", cfg.tracing.endpoint, cfg.tracing.protocol)
    return CallSpans(cfg.tracing)


def pipeline_summary(stats) -> str:
    """One line on how the prepare/execute pipeline went (``PipelineStats``)."""
    hidden = stats.prepare_overlapped_s / stats.prepare_s if stats.prepare_s else 0.0
    return (f"{stats.batches} batches, {stats.sequences} sequences, {stats.tokens} tokens; "
            f"execute {stats.execute_s:.2f} s, prepare {stats.prepare_s:.2f} s "
            f"({hidden:.0%} of it while a batch executed)")


def _remove_socket_file(address: str) -> None:
    addr = parse_address(address)
    if addr.kind == "unix":
        try:
            os.unlink(addr.path)
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    sys.exit(main())
