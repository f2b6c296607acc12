"""``poolgate bench-arch``: packed vs transformers-fallback throughput of one model shape, in-process.

With ``--write-to DIR`` it instead writes the shape as a servable random-weight
folder (``workers.tools.shape_folder``: the checkpoint plus the bundled
tokenizer) for ``poolgate serve DIR`` and ``poolgate bench``, and exits; the
dual encoders' shapes (``--family clip --shape vit-b32``, ``siglip/base-224``:
``workers.tools.media_shapes``) are written only so, for ``poolgate bench --images``.

No server: ``workers.tools.bench_arch`` builds a random-weight checkpoint of the
named shape, runs the synthetic corpus through poolgate's packed family and
through transformers' AutoModel on the same batches, and this module prints
tokens/s for both, their ratio, and the report as one JSON line (the last line
of stdout). torch is imported only when the command runs, so the gateway stays
torch-free at import. Exit 0 on a run, 2 when it cannot start (unknown shape,
no packed family for it).
"""

from __future__ import annotations

import argparse
import json
import sys

from poolgate.shared.config.flags import positive_int

DTYPES = ("float32", "bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``poolgate bench-arch``."""
    parser.add_argument("--family", default="modernbert", help="model family of the shape (e.g. modernbert, mpnet)")
    parser.add_argument("--shape", default="base", help="size within the family (e.g. base)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--num-texts", type=positive_int, default=256, help="synthetic corpus size")
    parser.add_argument("--seed", type=int, default=0, help="corpus and weight seed")
    parser.add_argument("--max-model-len", type=positive_int, default=512, help="tokens per text at most")
    parser.add_argument("--max-batch-tokens", type=positive_int, default=8192, help="token budget of one batch")
    parser.add_argument(
        "--sorted", action="store_true", help="length-sort the corpus first (the padded fallback's best case)"
    )
    parser.add_argument("--num-threads", type=positive_int, default=None, help="torch threads (default: cores)")
    parser.add_argument(
        "--write-to",
        default=None,
        metavar="DIR",
        help="write the shape as a servable random-weight model folder (with the bundled tokenizer) "
        "for poolgate serve / poolgate bench, and exit",
    )


def format_report(r: dict) -> str:
    rows = [(r["packed"]["implementation"], r["packed"]), (r["fallback"]["implementation"], r["fallback"])]
    width = max(len(name) for name, _ in rows)
    lines = [
        f"{r['family']}/{r['shape']} ({r['architecture']}), {r['dtype']}, {r['threads']} threads: "
        f"{r['texts']} texts, {r['tokens']:,} tokens, {r['batches']} {r['order']} batches of "
        f"<= {r['batch_tokens']} tokens"
    ]
    lines += [f"  {name:<{width}}  {v['tokens_per_s']:>10,.1f} tokens/s  ({v['seconds']:.2f} s)" for name, v in rows]
    lines.append(
        f"  packed / fallback: {r['speedup']:.2f}x   (worst cosine between the two on batch 1: "
        f"{r['worst_cosine_first_batch']:.6f})"
    )
    return "\n".join(lines)


def write_folder(args: argparse.Namespace) -> int:
    from pathlib import Path

    from poolgate.workers.tools.shape_folder import write_shape

    try:
        architecture = write_shape(
            Path(args.write_to), args.family, args.shape, seed=args.seed, max_model_len=args.max_model_len
        )
    except ValueError as exc:
        print(f"poolgate bench-arch: cannot write {args.family}/{args.shape}: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps({"folder": args.write_to, "family": args.family, "shape": args.shape, "architecture": architecture}),
        flush=True,
    )
    return 0


def write_dual_folder(args: argparse.Namespace) -> int:
    """A dual encoder's random-weight folder (``workers.tools.media_shapes``), for ``poolgate bench --images``."""
    from pathlib import Path

    from poolgate.workers.tools.media_shapes import write_dual

    try:
        architecture = write_dual(Path(args.write_to), args.family, args.shape, seed=args.seed)
    except KeyError as exc:
        print(f"poolgate bench-arch: {exc.args[0]}", file=sys.stderr)
        return 2
    print(
        json.dumps({"folder": args.write_to, "family": args.family, "shape": args.shape, "architecture": architecture}),
        flush=True,
    )
    return 0


def main(args: argparse.Namespace) -> int:
    from poolgate.workers.tools.media_shapes import is_dual_shape

    if is_dual_shape(args.family):  # images in: written for serving only (no packed family to compare)
        if args.write_to is None:
            print(
                f"poolgate bench-arch: {args.family} shapes are written with --write-to DIR and measured with "
                "poolgate bench --images",
                file=sys.stderr,
            )
            return 2
        return write_dual_folder(args)
    from poolgate.workers.memory import bound_memory

    bound_memory()  # the worker's allocator bounds, before torch loads: measured as the worker runs
    from poolgate.workers.tools.bench_arch import BenchConfig, run, shape_config

    try:
        shape_config(args.family, args.shape)
    except KeyError as exc:
        print(f"poolgate bench-arch: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.write_to is not None:
        return write_folder(args)
    cfg = BenchConfig(
        family=args.family,
        shape=args.shape,
        dtype=args.dtype,
        num_texts=args.num_texts,
        seed=args.seed,
        max_len=args.max_model_len,
        batch_tokens=args.max_batch_tokens,
        sort=args.sorted,
        num_threads=args.num_threads,
    )
    try:
        report = run(cfg)
    except ValueError as exc:
        print(f"poolgate bench-arch: cannot run: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    print(json.dumps(report, sort_keys=True), flush=True)
    return 0
