"""The prefix cache on a rerank call: 1 query × N documents through one runner, with the cache off and on.

A random-weight checkpoint of a real shape (``workers.tools.bench_shapes``; the
default ``qwen3/0.6b-4l`` is Qwen3-Reranker-0.6B's body, 4 of its 28 layers) runs
what one ``/rerank`` call runs: N pairs laid out as Qwen3-Reranker's template lays
them out (a shared head of system prompt, instruction and query, then the
document, then the template's fixed tail), in the scheduler's FIFO token-budget
batches, LAST-pooled. The yes/no head reads two rows of the LM head per pair and is
left out (its cost does not change with the cache). Three timings: the cache off;
on and empty (the first call: the head is computed once per batch and shared); on
and holding the head (a second call with the same query and other documents). Each
reports seconds and the tokens the layers computed; the worst cosine of the cached
outputs against the uncached ones shows the cache changes nothing. ``--blocks``
times the first two cache runs again per block size.

    python -m poolgate.workers.tools.bench_prefix --dtype bfloat16 --docs 100 --doc-tokens 200
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.prefix_cache import BLOCK, PrefixCache
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.tools.bench_arch import _runner, batches, make_checkpoint

HEAD, TAIL = 77, 12  # Qwen3-Reranker's system + instruction + a short query, and its assistant tail, in tokens


def pairs(docs: int, doc_tokens: int, seed: int, vocab: int = 30000) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    head, tail = rng.integers(100, vocab, HEAD).tolist(), rng.integers(100, vocab, TAIL).tolist()
    return [head + rng.integers(100, vocab, doc_tokens).tolist() + tail for _ in range(docs)]


def timed(runner, ids: list[list[int]], budget: int) -> tuple[float, np.ndarray]:
    params, out = PoolingParams(task="embed"), []
    start = time.perf_counter()
    for batch in batches(ids, budget):
        out += [o.rows.values for o in runner.run([Sequence(s, params) for s in batch])]
    return time.perf_counter() - start, np.concatenate(out)


def computed(cache: PrefixCache, before: dict[str, int], tokens: int) -> int:
    after = cache.stats()
    return tokens - (after["hit_tokens"] - before["hit_tokens"]) - (after["shared_tokens"] - before["shared_tokens"])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return round(float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min()), 6)


def run(args: argparse.Namespace) -> dict:
    """Each rep runs the cache-off and cache-on calls in turn (so other load falls on both alike); medians."""
    from poolgate.workers.backends import get_backend

    get_backend("cpu").setup(args.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    first, second = pairs(args.docs, args.doc_tokens, 0), pairs(args.docs, args.doc_tokens, 1)
    second = [first[0][:HEAD] + s[HEAD:] for s in second]  # the same query, other documents
    unique = [s[HEAD:] for s in pairs(args.docs, args.doc_tokens + HEAD, 2)]  # nothing shared: the cache's overhead
    tokens = sum(len(s) for s in first)
    with tempfile.TemporaryDirectory(prefix="poolgate-bench-prefix-") as tmp:
        make_checkpoint(Path(tmp), args.family, args.shape)
        runner, _ = _runner(Path(tmp), dtype, True, HEAD + args.doc_tokens + TAIL)
    _, want_second = timed(runner, second, args.budget)  # warm-up, and the reference for the cache's hits
    report: dict = {"shape": f"{args.family}/{args.shape}", "dtype": args.dtype, "pairs": args.docs,
                    "tokens_per_call": tokens, "budget": args.budget, "repeat": args.repeat}
    for block in args.blocks:
        times: dict[str, list[float]] = {}
        row: dict = {}
        for _ in range(args.repeat):
            for name, ids in (("off", first), ("off_nothing_shared", unique)):
                runner.prefix_cache = None
                seconds, want = timed(runner, ids, args.budget)
                times.setdefault(name, []).append(seconds)
                row[name] = {"computed": tokens, "want": want}
            cache = runner.prefix_cache = PrefixCache(runner.pooler, args.mb << 20, block=block,
                                                      group_attention=runner.group_attention)
            for name, ids, ref in (("first_call", first, "off"), ("same_query_again", second, None),
                                   ("nothing_shared", unique, "off_nothing_shared")):
                before = cache.stats()
                seconds, got = timed(runner, ids, args.budget)
                times.setdefault(name, []).append(seconds)
                row[name] = {"computed": computed(cache, before, tokens)}
                row[name]["worst_cosine"] = cosine(got, want_second if ref is None else row[ref]["want"])
            row["bytes_held"] = cache.stats()["bytes"]
            runner.prefix_cache = None
        for name, seconds in times.items():
            row[name].pop("want", None)
            row[name]["seconds"] = round(float(np.median(seconds)), 3)
        report[f"block_{block}"] = row
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="qwen3")
    p.add_argument("--shape", default="0.6b-4l")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--docs", type=int, default=100)
    p.add_argument("--doc-tokens", type=int, default=200)
    p.add_argument("--budget", type=int, default=8192, help="tokens per batch (the CPU's default budget)")
    p.add_argument("--mb", type=int, default=256, help="the cache's bound")
    p.add_argument("--blocks", type=int, nargs="+", default=[BLOCK])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeat", type=int, default=3, help="reps, each running every case in turn (medians)")
    print(json.dumps(run(p.parse_args(argv)), indent=1))


if __name__ == "__main__":
    main()
