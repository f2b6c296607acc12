"""Benchmark statistics: turns raw load results into a report dict, a table and JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from poolgate.gateway.bench.load import LoadConfig, LoadResult

PERCENTILES = (50, 95, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linear between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def throughput(result: LoadResult) -> dict[str, Any]:
    """A ``load.LoadResult``'s inputs, tokens, wall time, their rates and its errors."""
    return {
        "inputs": result.inputs,
        "tokens": result.prompt_tokens,
        "wall_s": result.wall_s,
        "inputs_per_s": rate(result.inputs, result.wall_s),
        "tokens_per_s": rate(result.prompt_tokens, result.wall_s),
        "errors": result.error_count,
    }


def latency_ms(latencies_s: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99, mean and max of per-request latencies, in milliseconds."""
    ms = [x * 1000.0 for x in latencies_s]
    out: dict[str, float | None] = {f"p{q}": percentile(ms, q) for q in PERCENTILES}
    out["mean"] = sum(ms) / len(ms) if ms else None
    out["max"] = max(ms) if ms else None
    return out


def summarize(result: LoadResult, cfg: LoadConfig, *, corpus: str, num_texts: int) -> dict:
    """The report of one HTTP run: setup, counts, rates, latencies, errors."""
    return {
        "url": cfg.url,
        "model": cfg.model,
        "encoding_format": cfg.encoding_format,
        "batch_size": cfg.batch_size,
        "concurrency": cfg.concurrency,
        "passes": None if cfg.duration_s is not None else cfg.passes,
        "duration_s": cfg.duration_s,
        "corpus": corpus,
        "texts": num_texts,
        "requests": result.requests,
        "ok_requests": result.ok_requests,
        "errors": result.error_count,
        "error_kinds": dict(result.errors),
        "error_samples": list(result.error_samples),
        "warmup_errors": result.warmup_errors,
        "inputs": result.inputs,
        "prompt_tokens": result.prompt_tokens,
        "embedding_dim": result.embedding_dim,
        "wall_s": result.wall_s,
        "tokens_per_s": rate(result.prompt_tokens, result.wall_s),
        "inputs_per_s": rate(result.inputs, result.wall_s),
        "requests_per_s": rate(result.requests, result.wall_s),
        "latency_ms": latency_ms(result.latencies_s),
    }


def add_reference(report: dict, reference: dict) -> dict:
    """A copy of ``report`` with the sentence-transformers run and the speed ratio."""
    st_rate = reference.get("tokens_per_s") or 0.0
    ratio = report["tokens_per_s"] / st_rate if st_rate > 0 else None
    return {**report, "sentence_transformers": reference, "ratio_vs_sentence_transformers": ratio}


def _fmt(value: object, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def format_table(report: dict) -> str:
    """An aligned, human-readable table; a sentence-transformers column when present."""
    st = report.get("sentence_transformers")
    lat = report["latency_ms"]
    passes = report["passes"]
    run = f"{passes} pass{'es' * (passes != 1)}" if passes is not None else f"{report['duration_s']} s"
    head = [
        f"poolgate bench  {report['url']}  model={report['model']}",
        f"corpus {report['corpus']} ({report['texts']:,} texts, {run}), batch {report['batch_size']}, "
        f"concurrency {report['concurrency']}, {report['encoding_format']}",
    ]
    rows = [("metric", "poolgate", "sentence-transformers" if st else None)]
    rows += [
        ("tokens/s", _fmt(report["tokens_per_s"]), _fmt(st and st["tokens_per_s"])),
        ("inputs/s", _fmt(report["inputs_per_s"]), _fmt(st and st["inputs_per_s"])),
        ("requests/s", _fmt(report["requests_per_s"]), "-"),
        ("prompt tokens", _fmt(report["prompt_tokens"]), _fmt(st and st["prompt_tokens"])),
        ("inputs", _fmt(report["inputs"]), _fmt(st and st["inputs"])),
        ("wall s", _fmt(report["wall_s"], 3), _fmt(st and st["wall_s"], 3)),
    ]
    rows += [(f"latency {k} ms", _fmt(lat[k], 2), "-") for k in ("p50", "p95", "p99")]
    rows.append(("requests (errors)", f"{report['requests']:,} ({report['errors']:,})", "-"))
    if st:
        rows.append(("poolgate / ST", f"{_fmt(report['ratio_vs_sentence_transformers'], 2)}x", ""))
    widths = [max(len(r[i] or "") for r in rows) for i in range(3)]
    lines = head + [""]
    for label, ours, theirs in rows:
        line = f"  {label:<{widths[0]}}  {ours:>{widths[1]}}"
        lines.append((line + (f"  {theirs:>{widths[2]}}" if st else "")).rstrip())
    if st:
        lines.append(
            f"  (sentence-transformers: {st['device']} {st['dtype']}, batch {st['batch_size']}, "
            f"max_seq_length {st['max_seq_length']})"
        )
    cos = report.get("cosine_to_fp32")
    if cos and "error" in cos:
        lines.append(f"  cosine to float32: {cos['error']}")
    elif cos:
        line = (
            f"  cosine to {cos['reference']} over {cos['vectors']:,} vectors: poolgate worst "
            f"{cos['poolgate_worst']:.6f}, mean {cos['poolgate_mean']:.6f}, "
            f"{cos['poolgate_below_0.999']} below 0.999"
        )
        if "st_worst" in cos:
            line += (
                f"; sentence-transformers {cos['st_dtype']} worst {cos['st_worst']:.6f}, "
                f"mean {cos['st_mean']:.6f}, {cos['st_below_0.999']} below 0.999"
            )
        lines.append(line)
    for kind, count in report["error_kinds"].items():
        lines.append(f"  error {kind}: {count:,}")
    lines += [f"    e.g. {s}" for s in report["error_samples"]]
    return "\n".join(lines)


def to_json(report: dict) -> str:
    """The report as one JSON line."""
    return json.dumps(report, separators=(",", ":"))
