"""``poolgate inspect MODEL [model flags]``: print what poolgate would run for a model, without loading it.

Takes the model flags of ``poolgate serve`` (``shared.config.model_flags``) and prints
``workers.load.inspect``'s table: implementation (packed family or transformers
fallback), tasks, pooling, max length, dtype, backend and attention path. This
module imports without torch; torch loads when the command runs. Exit 0, or
2 with the reason when the folder cannot be served.
"""
from __future__ import annotations

import argparse
import sys

from poolgate.shared.config.model_flags import add_model_arguments, worker_config_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)


def main(args: argparse.Namespace) -> int:
    try:
        cfg = worker_config_from_args(args)
        from poolgate.workers.load.inspect import plan

        table = plan(cfg).table()
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"poolgate inspect: error: {exc}", file=sys.stderr)
        return 2
    print(table)
    return 0
