"""Chunked prefill on one long input with short requests beside it, through one runner, chunked and not.

A random-weight checkpoint of a real shape (``workers.tools.bench_shapes``; the
default ``qwen3/0.6b-4l`` is Qwen3-Embedding-0.6B's body, 4 of its 28 layers;
``--layers`` cuts it further) embeds one ``--long``-token input (LAST-pooled)
while short requests of ``--short`` tokens arrive every ``--every`` seconds.
Batches are cut as the engine's scheduler cuts them (one thread, no prepare
overlap): the long input's next chunk first, then every short request that has
arrived, up to ``--budget`` tokens. Without chunked prefill the long input runs
whole in one batch (the scheduler lets a lone over-budget input go), and the
short requests that arrive meanwhile wait for it. Reported per mode: the long
input's seconds, the p50/p99 latency of the short requests (arrival to their
batch's end), the largest K/V store held (bytes, the model's dtype), the
process's peak resident memory (``resource.getrusage`` ``ru_maxrss``, so the
chunked run goes first: the unchunked one can only raise it) and the cosine of
the chunked embedding against the unchunked one.

    python -m poolgate.workers.tools.bench_chunked_prefill --long 32768 --budget 8192
"""
from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.chunked_prefill import ChunkedPrefill, Prefill
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.tools.bench_arch import _runner, make_checkpoint

PARAMS = PoolingParams(task="embed")


def rss_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # Linux: KiB


def serve(runner, long: list[int], shorts: int, short_tokens: int, every: float, budget: int,
          chunked: bool) -> dict:
    """Run the long input and the short requests arriving beside it; latencies and the long input's row."""
    rng = np.random.default_rng(1)
    pf = Prefill(long, max(1, budget // 2)) if chunked else None
    seq = Sequence(pf.chunk() if pf else long, PARAMS, prefill=pf)
    start = time.perf_counter()
    arrivals = [start + i * every for i in range(shorts)]
    waiting: list[tuple[float, Sequence]] = []
    latencies, long_s, row, held, sent = [], None, None, 0, 0
    while long_s is None or sent < shorts or waiting:
        now = time.perf_counter()
        while sent < shorts and arrivals[sent] <= now:
            waiting.append((arrivals[sent], Sequence(rng.integers(100, 30000, short_tokens).tolist(), PARAMS)))
            sent += 1
        batch, used = ([seq], seq.num_tokens) if long_s is None else ([], 0)
        took = []
        while waiting and used + waiting[0][1].num_tokens <= max(budget, used):
            took.append(waiting.pop(0))
            used += took[-1][1].num_tokens
        if not batch and not took:
            time.sleep(max(0.0, arrivals[sent] - now) if sent < shorts else 0.0)
            continue
        outs = runner.run(batch + [s for _, s in took])
        end = time.perf_counter()
        latencies += [end - arrived for arrived, _ in took]
        if batch:
            held = max(held, pf.nbytes if pf else 0)
            if pf is None or pf.final:
                long_s, row = end - start, outs[0].rows.values[:1].astype(np.float64)
                if pf:
                    pf.free()
            else:
                seq.token_ids = pf.advance()
    lat = np.asarray(latencies)
    return {"long_s": round(long_s, 2), "short_p50_s": round(float(np.percentile(lat, 50)), 3),
            "short_p99_s": round(float(np.percentile(lat, 99)), 3), "shorts": len(lat),
            "kv_store_mb": round(held / 2**20, 1), "peak_rss_mb": rss_mb(), "row": row}


def run(args: argparse.Namespace) -> dict:
    from poolgate.workers.backends import get_backend
    from poolgate.workers.tools.bench_shapes import SHAPES

    get_backend("cpu").setup(args.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    shape = SHAPES[args.family][args.shape]
    layers = args.layers or shape["num_hidden_layers"]
    SHAPES[args.family][args.shape] = {**shape, "num_hidden_layers": layers, "max_position_embeddings": args.long + 8}
    with tempfile.TemporaryDirectory(prefix="poolgate-bench-chunked-") as tmp:
        make_checkpoint(Path(tmp), args.family, args.shape)
        runner, _ = _runner(Path(tmp), dtype, True, args.long + 8)
    runner.chunked_prefill = ChunkedPrefill(runner.pooler, group_attention=runner.group_attention)
    long = np.random.default_rng(0).integers(100, 30000, args.long).tolist()
    runner.run([Sequence(long[:args.short], PARAMS)])  # warm-up
    report: dict = {"shape": f"{args.family}/{args.shape}", "layers": layers, "dtype": args.dtype,
                    "long_tokens": args.long, "budget": args.budget, "chunk": args.budget // 2,
                    "short_tokens": args.short, "short_every_s": args.every, "shorts": args.shorts}
    for name in ("chunked", "whole"):
        report[name] = serve(runner, long, args.shorts, args.short, args.every, args.budget, name == "chunked")
    a, b = report["chunked"].pop("row"), report["whole"].pop("row")
    report["cosine_chunked_vs_whole"] = round(float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b))), 6)
    report["max_abs_diff"] = float(np.abs(a - b).max())
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="qwen3")
    p.add_argument("--shape", default="0.6b-4l")
    p.add_argument("--layers", type=int, default=None, help="cut the shape's depth further")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--long", type=int, default=32768, help="tokens of the long input")
    p.add_argument("--budget", type=int, default=8192, help="tokens per batch (the CPU's default budget)")
    p.add_argument("--short", type=int, default=64, help="tokens of each short request")
    p.add_argument("--every", type=float, default=0.25, help="seconds between short requests")
    p.add_argument("--shorts", type=int, default=40, help="short requests sent")
    p.add_argument("--threads", type=int, default=None)
    print(json.dumps(run(p.parse_args(argv)), indent=1))


if __name__ == "__main__":
    main()
