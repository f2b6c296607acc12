"""Embed a Parquet corpus with Ray Data and poolgate, and write the vectors as Parquet.

    pip install "poolgate[ray]"
    python examples/ray_embed_parquet.py corpus/ vectors/ --make-corpus 2000 --actors 2 --num-cpus 1

reads every Parquet file under INPUT (a ``text`` column; ``--make-corpus N`` first writes N synthetic texts
there, random English words from poolgate's ``shared/domain/words.txt``, in files of 250 rows), embeds the
texts on ``--actors`` Ray actors, each one ``PoolingModel`` (``poolgate.integrations.ray.PoolingUDF``) with
``--num-cpus`` cores (or ``--num-gpus``), and writes OUTPUT: the input's columns plus ``embeddings``
(``fixed_size_list<float>``) and ``num_input_tokens``. It prints Ray's start-up time, then rows/s and
tokens/s over the wall clock of the whole pipeline (reading, the actors loading their models, embedding,
writing). ``ray.init()`` joins the cluster in ``--address`` / ``RAY_ADDRESS`` (as in a KubeRay RayJob;
nothing else changes on a cluster), or starts a local Ray. Ray Data's listing, reading and writing tasks
take a CPU each beside the actors: with every CPU of a cluster held by actors the pipeline waits forever,
so a local Ray counts one CPU more than the actors take (or the host's count, when larger).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import ray

from poolgate.integrations.ray import map_batches_kwargs
from poolgate.shared.domain.corpus import synthetic_corpus

ROWS_PER_FILE = 250


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="a Parquet file or a folder of them, with a text column")
    parser.add_argument("output", help="the folder Ray writes the Parquet output to")
    parser.add_argument("--model", default=None, help="a local model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--actors", type=int, default=1, help="Ray actors, one model each (default 1)")
    parser.add_argument("--num-cpus", type=float, default=1, help="CPUs per actor (its torch threads; default 1)")
    parser.add_argument("--num-gpus", type=float, default=None, help="GPUs per actor (default: none)")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per batch, one engine call (default 256)")
    parser.add_argument("--dtype", default="auto", help="the model's dtype (default auto)")
    parser.add_argument("--text-column", default="text")
    parser.add_argument(
        "--truncate-prompt-tokens",
        type=int,
        default=-1,
        help="cut longer texts to this many tokens (default -1: the model's maximum)",
    )
    parser.add_argument("--make-corpus", type=int, metavar="N", help="first write N synthetic texts to INPUT")
    parser.add_argument("--address", default=None, help="a Ray cluster to join (default: RAY_ADDRESS, or local)")
    return parser.parse_args()


def make_corpus(folder: Path, n: int) -> None:
    """``n`` synthetic texts (``id``, ``text``) as Parquet files of ``ROWS_PER_FILE`` rows under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = synthetic_corpus(n)
    for start in range(0, n, ROWS_PER_FILE):
        part = texts[start : start + ROWS_PER_FILE]
        table = pa.table({"id": range(start, start + len(part)), "text": part})
        pq.write_table(table, folder / f"part-{start // ROWS_PER_FILE:05d}.parquet")
    print(f"wrote {n} texts to {folder}")


def main() -> None:
    args = parse_args()
    if args.make_corpus:
        make_corpus(Path(args.input), args.make_corpus)
    started = time.perf_counter()
    if args.address or "RAY_ADDRESS" in os.environ:  # a cluster (a KubeRay RayJob's entrypoint has RAY_ADDRESS set)
        ray.init(address=args.address)
    else:  # local: the actors' CPUs plus one for Ray Data's list, read and write tasks, at least the host's
        ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(args.actors * args.num_cpus) + 1))
    ray_s = time.perf_counter() - started

    started = time.perf_counter()
    # Ray sizes blocks by bytes, and an actor takes a whole block: a corpus of short texts would be one block, so
    # one busy actor. Blocks of one batch each go to whichever actor is free (streaming, no shuffle).
    ds = ray.data.read_parquet(args.input).repartition(target_num_rows_per_block=args.batch_size)
    udf = map_batches_kwargs(
        args.model,
        concurrency=args.actors,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        batch_size=args.batch_size,
        batch_format="pyarrow",
        dtype=args.dtype,
        text_column=args.text_column,
        truncate_prompt_tokens=args.truncate_prompt_tokens,
    )
    ds.map_batches(**udf).write_parquet(args.output)  # the pipeline runs here, streaming
    pipeline_s = time.perf_counter() - started

    counts = pq.read_table(args.output, columns=["num_input_tokens"]).column("num_input_tokens")
    rows, tokens = len(counts), pa.compute.sum(counts).as_py()
    print(f"ray start-up: {ray_s:.1f} s")
    print(
        f"pipeline: {rows} rows, {tokens} tokens in {pipeline_s:.1f} s (read, load {args.actors} model(s), "
        f"embed, write): {rows / pipeline_s:.1f} rows/s, {tokens / pipeline_s:.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
