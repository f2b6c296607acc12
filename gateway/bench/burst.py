"""``poolgate bench --burst``: N requests sent at once; how many are admitted, refused, and how long they wait.

All ``--burst-requests`` requests (``--batch-size`` inputs each, over the
corpus, cycled) leave together on their own connections (concurrency = N),
after ``--warmup`` requests one at a time. Counted: sent, admitted (200 with
the asked embeddings), refused (429, with the median of their
``Retry-After`` seconds), errors (anything else). Reported: the admitted
requests' latency p50/p90/p99/max against the server's admission limit in
seconds. ``/admin/pools`` does not show that limit, so it is the one given
(``--max-queued-s``, the server's ``--max-queued-seconds``; default the
gateway's default), printed beside the latencies.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp

from poolgate.gateway.bench.load import BadResponse, LoadConfig, auth_headers, decode_embeddings, make_payloads
from poolgate.gateway.bench.report import _fmt, percentile

LATENCY_QUANTILES = (50, 90, 99)


@dataclass(frozen=True)
class BurstOutcome:
    """One request's fate: HTTP status (None: no answer), seconds to the answer, Retry-After seconds, error."""

    status: int | None
    latency_s: float
    retry_after_s: float | None = None
    error: str | None = None


def _retry_after_s(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


async def post_once(
    session: aiohttp.ClientSession, url: str, payload: tuple[bytes, int], encoding_format: str
) -> BurstOutcome:
    """POST one body; a 200 counts only when it holds one embedding per input."""
    body, n_inputs = payload
    start = time.perf_counter()
    try:
        async with session.post(url, data=body) as resp:
            raw = await resp.read()
            latency_s = time.perf_counter() - start
            retry_after_s = _retry_after_s(resp.headers.get("Retry-After"))
            if resp.status == 200:
                decode_embeddings(json.loads(raw), n_inputs, encoding_format)
            return BurstOutcome(resp.status, latency_s, retry_after_s)
    except (BadResponse, json.JSONDecodeError) as exc:
        return BurstOutcome(None, time.perf_counter() - start, error=f"bad response: {exc}")
    except (TimeoutError, aiohttp.ClientError) as exc:
        return BurstOutcome(None, time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}")


def burst_payloads(texts: list[str], cfg: LoadConfig, n_requests: int) -> list[tuple[bytes, int]]:
    """``n_requests`` bodies of ``cfg.batch_size`` inputs, cycling over the corpus's batches."""
    batches = make_payloads(texts, cfg)
    return [batches[i % len(batches)] for i in range(n_requests)]


async def send_burst(cfg: LoadConfig, payloads: list[tuple[bytes, int]]) -> tuple[list[BurstOutcome], float]:
    """The warm-up one request at a time, then every payload at once; the burst's outcomes in order and its
    seconds from the first send to the last answer."""
    url = f"{cfg.url.rstrip('/')}/v1/embeddings"
    headers = {"Content-Type": "application/json", **auth_headers(cfg.api_key)}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        for i in range(cfg.warmup):
            await post_once(session, url, payloads[i % len(payloads)], cfg.encoding_format)
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(post_once(session, url, p, cfg.encoding_format) for p in payloads))
        return list(outcomes), time.perf_counter() - start


def burst_report(outcomes: list[BurstOutcome], cfg: LoadConfig, max_queued_s: float | None, wall_s: float) -> dict:
    """Counts, the admitted latencies (ms) and the refusals' median Retry-After (s), beside the limit."""
    admitted_ms = [o.latency_s * 1000.0 for o in outcomes if o.status == 200]
    retry_s = [o.retry_after_s for o in outcomes if o.status == 429 and o.retry_after_s is not None]
    errors = [o for o in outcomes if o.status not in (200, 429)]
    latency: dict[str, float | None] = {f"p{q}": percentile(admitted_ms, q) for q in LATENCY_QUANTILES}
    latency["max"] = max(admitted_ms) if admitted_ms else None
    return {
        "mode": "burst",
        "url": cfg.url,
        "model": cfg.model,
        "batch_size": cfg.batch_size,
        "encoding_format": cfg.encoding_format,
        "sent": len(outcomes),
        "admitted": len(admitted_ms),
        "refused": sum(o.status == 429 for o in outcomes),
        "refused_retry_after_p50_s": percentile(retry_s, 50),
        "errors": len(errors),
        "error_kinds": dict(Counter(o.error or f"HTTP {o.status}" for o in errors)),
        "admitted_latency_ms": latency,
        "max_queued_s": max_queued_s,
        "max_queued_s_source": "given: --max-queued-s",
        "wall_s": wall_s,
    }


async def run_burst(cfg: LoadConfig, texts: list[str], n_requests: int, max_queued_s: float | None) -> dict:
    """One burst of ``n_requests`` requests (module doc); its report."""
    outcomes, wall_s = await send_burst(cfg, burst_payloads(texts, cfg, n_requests))
    return burst_report(outcomes, cfg, max_queued_s, wall_s)


def format_burst(report: dict) -> str:
    """An aligned table of the burst's report."""
    lat = report["admitted_latency_ms"]
    limit_s = report["max_queued_s"]
    limit = "off" if limit_s is None else f"{limit_s:g} s = {limit_s * 1000:,.0f} ms"
    rows = [
        ("sent", _fmt(report["sent"])),
        ("admitted (200)", _fmt(report["admitted"])),
        ("refused (429)", _fmt(report["refused"])),
        ("refused Retry-After p50 s", _fmt(report["refused_retry_after_p50_s"], 1)),
        ("errors", _fmt(report["errors"])),
        *((f"admitted latency {k} ms", _fmt(lat[k], 1)) for k in (*(f"p{q}" for q in LATENCY_QUANTILES), "max")),
        ("admission limit", f"{limit} ({report['max_queued_s_source']})"),
        ("burst wall s", _fmt(report["wall_s"], 3)),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [
        f"poolgate bench --burst  {report['url']}  model={report['model']}",
        f"{report['sent']:,} requests at once, batch {report['batch_size']}, {report['encoding_format']}",
        "",
    ]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    lines += [f"  error {kind}: {count:,}" for kind, count in report["error_kinds"].items()]
    return "\n".join(lines)
