"""Several models of one gateway under load: each alone, then all at once (``poolgate bench --model A --model B``).

Each model gets its own load (the same corpus, batch size, concurrency and
duration) first on its own, one model after the other, then all together, so
the report shows what serving them side by side costs each one: its tokens/s
together vs alone. The gateway and its workers stay as they are between runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from poolgate.gateway.bench.load import LoadConfig, LoadResult, run_load
from poolgate.gateway.bench.report import _fmt, rate, summarize


async def alone_then_together(cfgs: list[LoadConfig], texts: list[str]) -> tuple[list[LoadResult], list[LoadResult]]:
    """One run per model on its own, then one run of every model at once."""
    alone = [await run_load(cfg, texts) for cfg in cfgs]
    together = await asyncio.gather(*(run_load(cfg, texts) for cfg in cfgs))
    return alone, list(together)


def mixed_report(
    cfgs: list[LoadConfig], alone: list[LoadResult], together: list[LoadResult], *, corpus: str, num_texts: int
) -> dict:
    """Per model: its report alone and together, and the ratio of their tokens/s; the totals."""
    models: list[dict[str, Any]] = []
    for cfg, a, t in zip(cfgs, alone, together, strict=True):
        ra = summarize(a, cfg, corpus=corpus, num_texts=num_texts)
        rt = summarize(t, cfg, corpus=corpus, num_texts=num_texts)
        models.append(
            {
                "model": cfg.model,
                "alone": ra,
                "together": rt,
                "together_vs_alone": rt["tokens_per_s"] / ra["tokens_per_s"] if ra["tokens_per_s"] else None,
            }
        )
    wall = max((t.wall_s for t in together), default=0.0)
    return {
        "url": cfgs[0].url,
        "models": models,
        "batch_size": cfgs[0].batch_size,
        "concurrency": cfgs[0].concurrency,
        "duration_s": cfgs[0].duration_s,
        "passes": None if cfgs[0].duration_s is not None else cfgs[0].passes,
        "corpus": corpus,
        "texts": num_texts,
        "together_tokens_per_s": rate(sum(t.prompt_tokens for t in together), wall),
        "errors": sum(m["alone"]["errors"] + m["together"]["errors"] for m in models),
    }


def format_mixed(report: dict) -> str:
    run = f"{report['duration_s']} s" if report["duration_s"] is not None else f"{report['passes']} pass(es)"
    lines = [
        f"poolgate bench  {report['url']}  {len(report['models'])} models: each alone, then all at once",
        f"corpus {report['corpus']} ({report['texts']:,} texts, {run} per run), batch {report['batch_size']}, "
        f"concurrency {report['concurrency']} per model",
        "",
    ]
    rows = [("model", "alone tok/s", "together tok/s", "together/alone", "p50 ms alone", "p50 ms together", "errors")]
    for m in report["models"]:
        a, t = m["alone"], m["together"]
        rows.append(
            (
                m["model"],
                _fmt(a["tokens_per_s"]),
                _fmt(t["tokens_per_s"]),
                _fmt(m["together_vs_alone"], 2),
                _fmt(a["latency_ms"]["p50"], 1),
                _fmt(t["latency_ms"]["p50"], 1),
                f"{a['errors'] + t['errors']:,}",
            )
        )
    rows.append(("all together", "", _fmt(report["together_tokens_per_s"]), "", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append(
            "  "
            + "  ".join(
                f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(lines)


def per_model(cfg: LoadConfig, models: list[str]) -> list[LoadConfig]:
    return [replace(cfg, model=model) for model in models]
