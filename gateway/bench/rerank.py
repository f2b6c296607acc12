"""``poolgate bench-rerank``: latency of one query against N documents on a running server's ``/rerank``.

Requests are sent one after another (``--concurrency 1``, the default), so
each latency is one whole rerank: N documents scored and sorted. Documents
come from the synthetic corpus (``bench.corpus``, seeded) or a file; every
request reranks the same query against the next N documents. Every response is
checked (N results, each index once, scores sorted high to low). Prints p50,
p90, p99 and mean latency in milliseconds, documents per second, and the
report as one JSON line (also to ``--json``). Exit 0 when every timed request
succeeded, 1 when any failed, 2 when the run could not start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from itertools import pairwise
from pathlib import Path

import aiohttp
import numpy as np

from poolgate.gateway.bench.load import BadResponse, auth_headers, first_model_id
from poolgate.shared.config.flags import positive_int
from poolgate.shared.domain.corpus import read_corpus, synthetic_corpus

QUERY = "which of these passages answers the question about the history of the city"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    parser.add_argument("--model", default=None, help="model name (default: first id of GET /v1/models)")
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--path", default="/rerank", choices=("/rerank", "/v1/rerank", "/v2/rerank"))
    parser.add_argument("--documents", type=positive_int, default=100, help="documents per rerank request")
    parser.add_argument("--requests", type=positive_int, default=30, help="timed requests")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests first")
    parser.add_argument("--concurrency", type=positive_int, default=1, help="requests in flight")
    parser.add_argument("--corpus", default=None, help="text file, one document per line")
    parser.add_argument("--seed", type=int, default=0, help="synthetic corpus seed")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the JSON report here")


def payloads(documents: list[str], n: int, count: int, model: str) -> list[bytes]:
    """``count`` request bodies, each the query and the next ``n`` documents (cycling)."""
    out = []
    for i in range(count):
        docs = [documents[(i * n + j) % len(documents)] for j in range(n)]
        out.append(
            json.dumps(
                {
                    "model": model,
                    "query": QUERY,
                    "documents": docs,
                    "truncate_prompt_tokens": -1,
                    "return_documents": False,
                }
            ).encode()
        )
    return out


def check(body: dict, n: int) -> None:
    results = body.get("results")
    if not isinstance(results, list) or len(results) != n:
        raise BadResponse(f"expected {n} results, got {len(results) if isinstance(results, list) else results!r}")
    if sorted(r["index"] for r in results) != list(range(n)):
        raise BadResponse("result indices are not each document once")
    scores = [r["relevance_score"] for r in results]
    if any(a < b for a, b in pairwise(scores)):
        raise BadResponse("results are not sorted by relevance_score")


async def run(args: argparse.Namespace, model: str, documents: list[str]) -> dict:
    url = f"{args.url.rstrip('/')}{args.path}"
    bodies = payloads(documents, args.documents, max(args.warmup, 0) + args.requests, model)
    latencies, errors = [], []
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    headers = {"Content-Type": "application/json", **auth_headers(args.api_key)}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:

        async def one(body: bytes, timed: bool) -> None:
            start = time.perf_counter()
            try:
                async with session.post(url, data=body) as resp:
                    out = await resp.json(content_type=None)
                    if resp.status != 200:
                        raise BadResponse(f"HTTP {resp.status}: {str(out)[:200]}")
                check(out, args.documents)
            except (TimeoutError, BadResponse, aiohttp.ClientError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            if timed:
                latencies.append(time.perf_counter() - start)

        for body in bodies[: max(args.warmup, 0)]:
            await one(body, timed=False)
        errors.clear()
        queue = list(bodies[max(args.warmup, 0) :])
        start = time.perf_counter()

        async def worker() -> None:
            while queue:
                await one(queue.pop(0), timed=True)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        wall = time.perf_counter() - start
    return summarize(latencies, errors, wall, args, model)


def summarize(latencies: list[float], errors: list[str], wall_s: float, args: argparse.Namespace, model: str) -> dict:
    ms = np.asarray(latencies) * 1e3
    pct = (lambda q: round(float(np.percentile(ms, q)), 2)) if len(ms) else (lambda q: None)
    return {
        "model": model,
        "path": args.path,
        "documents": args.documents,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "ok": len(latencies),
        "errors": len(errors),
        "error_samples": errors[:3],
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "mean_ms": round(float(ms.mean()), 2) if len(ms) else None,
        "documents_per_s": round(len(latencies) * args.documents / wall_s, 1) if wall_s > 0 else None,
    }


def main(args: argparse.Namespace) -> int:
    try:
        documents = read_corpus(args.corpus) if args.corpus else synthetic_corpus(max(args.documents, 1000), args.seed)
        model = args.model or asyncio.run(first_model_id(args.url, args.api_key, args.timeout))
    except (TimeoutError, OSError, ValueError, BadResponse, aiohttp.ClientError) as exc:
        print(f"poolgate bench-rerank: cannot start: {exc}", file=sys.stderr)
        return 2
    report = asyncio.run(run(args, model, documents))
    print(
        f"rerank 1 query x {report['documents']} documents on {model} ({report['path']}, "
        f"{report['ok']}/{report['requests']} ok): p50 {report['p50_ms']} ms, p90 {report['p90_ms']} ms, "
        f"p99 {report['p99_ms']} ms, mean {report['mean_ms']} ms, {report['documents_per_s']} documents/s"
    )
    line = json.dumps(report)
    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(line + "\n", encoding="utf-8")
    return 0 if report["errors"] == 0 else 1
