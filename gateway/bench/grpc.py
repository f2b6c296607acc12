"""``poolgate bench --grpc HOST:PORT``: TEI's gRPC ``EmbedStream`` against HTTP ``/v1/embeddings`` (base64), side by
side in one run, against one running ``poolgate serve --grpc-port``.

Two measures, each alternated between the protocols ``--passes`` times (HTTP then gRPC, then again), so drift
on the machine falls on both:

- throughput at the same concurrency: ``--concurrency`` callers at once. Over HTTP each caller sends requests of
  ``--batch-size`` inputs (base64 vectors), one after the other, until the corpus is done; over gRPC each caller
  holds one ``EmbedStream`` and streams its share of the corpus (one input per message, as TEI's clients do; the
  server batches what arrives together). Inputs/s and tokens/s (``usage.prompt_tokens`` and the sum of each
  answer's ``Metadata.compute_tokens``: the same tokenizer's count) over the wall time of the whole corpus;
- single small request latency: one input (``--latency-tokens`` words) at a time, ``--latency-requests`` times
  each way (unary ``Embed`` and a one-input HTTP request); p50/p95 in ms.

The gRPC client uses the server's own protos (``gateway.grpc.protos``), no generated code.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import aiohttp

from poolgate.gateway.bench.load import LoadConfig, auth_headers, run_load
from poolgate.gateway.bench.report import latency_ms, rate, throughput
from poolgate.shared.config.flags import positive_int


def add_grpc_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("gRPC against HTTP (gateway.bench.grpc)")
    group.add_argument(
        "--grpc",
        default=None,
        metavar="HOST:PORT",
        help="the server's --grpc-port: EmbedStream against /v1/embeddings (base64) at --concurrency, and the "
        "p50 of one small request each way, side by side (--url is the same server's HTTP address)",
    )
    group.add_argument(
        "--latency-requests", type=positive_int, default=200, metavar="N", help="single requests each way"
    )


def _stubs(target: str) -> tuple[Any, Any, Any, Any]:
    import grpc

    from poolgate.gateway.grpc.protos import load

    protos = load()
    request, response = protos.message("tei.v1.EmbedRequest"), protos.message("tei.v1.EmbedResponse")
    channel = grpc.aio.insecure_channel(target)
    stream = channel.stream_stream(
        "/tei.v1.Embed/EmbedStream",
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )
    unary = channel.unary_unary(
        "/tei.v1.Embed/Embed", request_serializer=request.SerializeToString, response_deserializer=response.FromString
    )
    return channel, request, stream, unary


def _metadata(cfg: LoadConfig) -> tuple[tuple[str, str], ...]:
    out = [("x-poolgate-model", cfg.model)]
    if cfg.api_key:
        out.append(("authorization", f"Bearer {cfg.api_key}"))
    return tuple(out)


async def grpc_throughput(target: str, cfg: LoadConfig, texts: list[str]) -> dict:
    channel, request, stream, _ = _stubs(target)
    shares = [texts[i :: cfg.concurrency] for i in range(cfg.concurrency)]
    metadata = _metadata(cfg)

    async def one(share: list[str]) -> tuple[int, int]:
        answers = tokens = 0
        messages = (request(inputs=t, truncate=cfg.truncate) for t in share)
        async for answer in stream(messages, metadata=metadata, timeout=cfg.timeout_s * 10):
            answers += 1
            tokens += answer.metadata.compute_tokens
        return answers, tokens

    try:
        await one(texts[: cfg.batch_size])  # warm-up: the connection and the first batches
        start = time.perf_counter()
        done = await asyncio.gather(*(one(s) for s in shares if s))
        wall = time.perf_counter() - start
    finally:
        await channel.close()
    inputs, tokens = sum(d[0] for d in done), sum(d[1] for d in done)
    return {
        "inputs": inputs,
        "tokens": tokens,
        "wall_s": wall,
        "inputs_per_s": rate(inputs, wall),
        "tokens_per_s": rate(tokens, wall),
    }


async def http_throughput(cfg: LoadConfig, texts: list[str]) -> dict:
    return throughput(await run_load(cfg, texts))


async def grpc_latency(target: str, cfg: LoadConfig, text: str, n: int) -> dict:
    channel, request, _, unary = _stubs(target)
    metadata, times = _metadata(cfg), []
    try:
        for i in range(n + 5):
            start = time.perf_counter()
            await unary(request(inputs=text, truncate=cfg.truncate), metadata=metadata, timeout=cfg.timeout_s)
            if i >= 5:  # the first few warm the channel
                times.append(time.perf_counter() - start)
    finally:
        await channel.close()
    return latency_ms(times)


async def http_latency(cfg: LoadConfig, text: str, n: int) -> dict:
    body: dict[str, Any] = {"model": cfg.model, "input": [text], "encoding_format": "base64"}
    if cfg.truncate:
        body["truncate_prompt_tokens"] = -1
    url, times = f"{cfg.url.rstrip('/')}/v1/embeddings", []
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=auth_headers(cfg.api_key)) as session:
        for i in range(n + 5):
            start = time.perf_counter()
            async with session.post(url, json=body) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            if i >= 5:
                times.append(time.perf_counter() - start)
    return latency_ms(times)


def run_grpc_compare(target: str, cfg: LoadConfig, texts: list[str], small: str, n: int, passes: int) -> dict:
    """The report (module doc): per pass and protocol, throughput and latency; the ratios of the best passes."""
    runs: dict[str, list[dict]] = {"http": [], "grpc": []}
    for _ in range(passes):
        http = asyncio.run(http_throughput(cfg, texts))
        http["latency_ms"] = asyncio.run(http_latency(cfg, small, n))
        runs["http"].append(http)
        grpc_run = asyncio.run(grpc_throughput(target, cfg, texts))
        grpc_run["latency_ms"] = asyncio.run(grpc_latency(target, cfg, small, n))
        runs["grpc"].append(grpc_run)
    best = {k: max(v, key=lambda r: r["inputs_per_s"]) for k, v in runs.items()}
    p50 = {k: min(r["latency_ms"]["p50"] for r in v) for k, v in runs.items()}
    return {
        "mode": "grpc_vs_http",
        "url": cfg.url,
        "grpc": target,
        "model": cfg.model,
        "texts": len(texts),
        "concurrency": cfg.concurrency,
        "http_batch_size": cfg.batch_size,
        "runs": runs,
        "grpc_over_http_inputs_per_s": rate(best["grpc"]["inputs_per_s"], best["http"]["inputs_per_s"]),
        "grpc_over_http_tokens_per_s": rate(best["grpc"]["tokens_per_s"], best["http"]["tokens_per_s"]),
        "p50_ms": p50,
    }


def format_grpc(report: dict) -> str:
    lines = [
        f"{report['texts']:,} texts, concurrency {report['concurrency']} "
        f"(HTTP: {report['http_batch_size']} inputs per request, base64; gRPC: one EmbedStream per caller)",
        f"{'pass':>4} {'protocol':>8} {'inputs/s':>10} {'tokens/s':>10} {'p50 ms':>8} {'p95 ms':>8}",
    ]
    for i, (http, grpc_run) in enumerate(zip(report["runs"]["http"], report["runs"]["grpc"], strict=True)):
        for name, r in (("http", http), ("grpc", grpc_run)):
            lat = r["latency_ms"]
            lines.append(
                f"{i + 1:>4} {name:>8} {r['inputs_per_s']:>10.1f} {r['tokens_per_s']:>10.1f} "
                f"{lat['p50']:>8.2f} {lat['p95']:>8.2f}"
            )
    lines.append(
        f"gRPC / HTTP (best passes): inputs/s {report['grpc_over_http_inputs_per_s']:.2f}x, tokens/s "
        f"{report['grpc_over_http_tokens_per_s']:.2f}x; p50 of one small request: gRPC "
        f"{report['p50_ms']['grpc']:.2f} ms, HTTP {report['p50_ms']['http']:.2f} ms"
    )
    return "\n".join(lines)


def grpc_report(args: argparse.Namespace, cfg: LoadConfig, texts: list[str]) -> dict:
    """``poolgate bench --grpc``: the module doc's run against ``--url`` and ``--grpc``."""
    import sys

    from poolgate.shared.domain.corpus import fixed_length_corpus

    small = fixed_length_corpus(1, max(args.latency_tokens - 2, 1), args.seed)[0]
    print(f"poolgate bench --grpc: {len(texts):,} texts -> {args.grpc} and {cfg.url}", file=sys.stderr)
    report = run_grpc_compare(args.grpc, cfg, texts, small, args.latency_requests, args.passes)
    report["errors"] = sum(r.get("errors", 0) for r in report["runs"]["http"])
    return report
