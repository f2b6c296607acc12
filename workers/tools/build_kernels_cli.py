"""``poolgate build-kernels [HEAD_DIM ...]``: build the CPU C kernels into the kernel cache ahead of any worker.

Builds the packed attention for each head dim given (default: every one it
takes, multiples of 16 up to 256; AMX variants too for multiples of 32; the
fp32 AVX2 kernel, ``cpu_attention_f32``, for each of them too),
the fused add + LayerNorm and the fp32 GELU (``gelu_f32``) with the machine's C compiler into
``$POOLGATE_KERNEL_CACHE`` (``workers.kernels.cpu_attention.prebuild``), so
workers, here or in an image built with this step, find them without a
compiler and build nothing at start. Prints each shared object's path; exit 0,
1 with one line when there is no compiler or a build fails, 2 for a head dim
the kernel does not take. Imports without torch; torch loads when it runs.
"""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("head_dims", metavar="HEAD_DIM", type=int, nargs="*",
                   help="attention head dims to build for (multiples of 16 up to 256; default: all of them)")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="compilers to run at once (default: one per CPU)")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def main(args: argparse.Namespace) -> int:
    from poolgate.shared.config.cpu import cpu_flags
    from poolgate.workers.kernels import cbuild, cpu_attention

    try:
        paths = cpu_attention.prebuild(args.head_dims or list(cpu_attention.HEAD_DIMS), jobs=args.jobs)
    except ValueError as exc:
        print(f"poolgate build-kernels: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:
        print(f"poolgate build-kernels: {_one_line(exc)}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    missing = cbuild.AVX512_BF16_FLAGS - cpu_flags()
    if missing:
        runs = "the fp32 attention and the torch paths" if cpu_flags() >= cbuild.AVX2_FLAGS else "the torch paths"
        print(f"poolgate build-kernels: built; this CPU lacks {', '.join(sorted(missing))}, so a worker here runs "
              f"{runs} (the builds serve another machine sharing this cache, or an image)", file=sys.stderr)
    return 0
