"""The ``poolgate`` command: parses flags into frozen config and dispatches."""
from __future__ import annotations

import argparse
import sys

from poolgate.shared.version import VERSION


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="poolgate", description=__doc__)
    parser.add_argument("--version", action="version", version=f"poolgate {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    from poolgate.gateway.bench.cli import add_arguments as add_bench
    from poolgate.gateway.serve import add_arguments as add_serve

    add_serve(sub.add_parser("serve", help="serve a pooling model over HTTP"))
    add_bench(sub.add_parser("bench", help="load-test a running server"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from poolgate.gateway.serve import main as serve_main

        return serve_main(args)
    from poolgate.gateway.bench.cli import main as bench_main

    return bench_main(args)


if __name__ == "__main__":
    sys.exit(main())
