"""The ``poolgate`` command: parses flags into frozen config and dispatches."""

from __future__ import annotations

import argparse
import sys

from poolgate.gateway import serve
from poolgate.gateway.bench import arch as bench_arch
from poolgate.gateway.bench import cli as bench
from poolgate.gateway.bench import lora as bench_lora
from poolgate.gateway.bench import rerank as bench_rerank
from poolgate.gateway.bench import runner as bench_runner
from poolgate.gateway.config.given import GIVEN, given_flags
from poolgate.gateway.jobs import run_batch
from poolgate.shared.config.cpu import apply_cpu_class
from poolgate.shared.version import VERSION
from poolgate.workers import cli as worker
from poolgate.workers.tools import build_kernels_cli as build_kernels
from poolgate.workers.tools import inspect_cli as inspect
from poolgate.workers.tools import verify_cli as verify

# name -> (module with add_arguments(parser) and main(args) -> exit code, one-line help)
COMMANDS = {
    "serve": (serve, "serve a pooling model over HTTP"),
    "worker": (worker, "run one worker alone, for a gateway's --worker-url (e.g. on another host)"),
    "run-batch": (
        run_batch,
        "run a file of requests (OpenAI batch JSONL) to a file of answers, on a model in this process or "
        "against a gateway (--url); re-run to resume",
    ),
    "bench": (bench, "load-test a running server"),
    "inspect": (
        inspect,
        "show what poolgate would run for a model (implementation, tasks, pooling, dtype, "
        "attention) without loading it",
    ),
    "verify": (
        verify,
        "compare a model's outputs in poolgate with its own library (sentence-transformers or "
        "transformers) on a fixed probe set, per task and dtype; exit 1 below the threshold",
    ),
    "bench-rerank": (bench_rerank, "latency of reranking one query against N documents on a running server"),
    "bench-arch": (bench_arch, "packed vs transformers-fallback throughput of one model shape, in-process"),
    "bench-runner": (bench_runner, "one model's runner alone (forward + pooling on packed batches), in-process"),
    "bench-lora": (bench_lora, "run-time LoRA adapters' cost on one model's runner: base, one adapter, four mixed"),
    "build-kernels": (
        build_kernels,
        "build the CPU C kernels (packed attention per head dim, fused add + "
        "LayerNorm) into the kernel cache, so workers build nothing at start",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="poolgate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"poolgate {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_) in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=help_, description=help_))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    module = COMMANDS[args.command][0]
    setattr(
        args, GIVEN, given_flags(module.add_arguments, argv[argv.index(args.command) + 1 :], args)
    )  # serve --config
    try:
        apply_cpu_class()  # POOLGATE_CPU_CLASS: before any torch kernel runs here or in a worker we spawn
    except ValueError as exc:
        print(f"poolgate: {exc}", file=sys.stderr)
        return 2
    return module.main(args)


if __name__ == "__main__":
    sys.exit(main())
