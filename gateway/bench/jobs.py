"""Bulk jobs against the live path, side by side in one run (``poolgate bench --jobs`` / ``--beside-job``).

``--jobs``: the same requests (the corpus in requests of ``--batch-size``
inputs) three ways, one after the other, nothing else running:

1. live: ``--concurrency`` clients over HTTP, the ``poolgate bench`` loop;
2. a job through the same gateway: the requests as batch lines, run by
   ``gateway.jobs`` (``run-batch --url``'s code, in this process, the lines
   in the bulk lane) with ``--job-inflight`` lines in flight;
3. unless ``--no-in-process``: ``poolgate run-batch`` on ``--job-model`` in a
   process of its own (its own gateway and worker, started before the clock:
   the rate is its own progress line's, from its first line to its last).

It reports inputs/s and tokens/s of each and the jobs' ratio to the live run.

``--beside-job LINES``: the live path's latency while a Batch API job runs
(the gateway at ``--url`` needs ``--batch-dir``): first ``--duration``
seconds (default 20) of live 1-input requests at ``--concurrency`` alone, then a job of
LINES lines (``--batch-size`` inputs each) is uploaded and created through
``/v1/files`` and ``/v1/batches`` and, once it is ``in_progress``, the same
live load again; the job's lines/s while the live load ran are read from its
``request_counts``; the job is cancelled at the end unless
``--wait-for-job``. It reports live p50/p99 alone and beside the job.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from poolgate.gateway.bench.load import LoadConfig, auth_headers, make_payloads, run_load
from poolgate.gateway.bench.report import latency_ms, rate, throughput
from poolgate.gateway.jobs.job import Counts, read_lines, run_job
from poolgate.gateway.jobs.sender import Sender
from poolgate.gateway.jobs.sinks import JsonlSink
from poolgate.shared.config.flags import positive_int


def add_jobs_arguments(parser: argparse.ArgumentParser) -> None:
    """``poolgate bench``'s flags of these two modes."""
    jobs = parser.add_argument_group("bulk jobs (gateway.bench.jobs)")
    jobs.add_argument(
        "--jobs",
        action="store_true",
        help="the corpus three ways, side by side: live requests (--batch-size, --concurrency), the same requests "
        "as a job through --url (run-batch --url's code), and `poolgate run-batch` in-process; inputs/s, tokens/s "
        "and each job's ratio to live",
    )
    jobs.add_argument("--job-inflight", type=positive_int, default=64, metavar="N", help="job lines in flight")
    jobs.add_argument(
        "--job-model", default=None, help="with --jobs: the in-process run-batch's MODEL (default: the bundled model)"
    )
    jobs.add_argument(
        "--no-in-process",
        dest="in_process",
        action="store_false",
        help="with --jobs: leave out the in-process run-batch",
    )
    jobs.add_argument(
        "--beside-job",
        type=positive_int,
        default=None,
        metavar="LINES",
        help="live 1-input requests (--concurrency, --duration seconds, default 20) alone, then beside a Batch "
        "API job of LINES lines of --batch-size inputs on --url (serve --batch-dir): p50/p99 of both",
    )
    jobs.add_argument(
        "--wait-for-job",
        action="store_true",
        help="with --beside-job: wait for the job to end instead of cancelling it",
    )


RATE_LINE = re.compile(r"([\d,]+)/([\d,]+) lines .*?, ([\d,]+) lines/s, ([\d,]+) tokens/s")


def write_job(path: Path, texts: list[str], cfg: LoadConfig) -> int:
    """The corpus as batch lines for /v1/embeddings, one line per request of ``cfg.batch_size`` inputs."""
    payloads = make_payloads(texts, cfg)
    with path.open("wb") as f:
        for i, (body, _) in enumerate(payloads):
            f.write(b'{"custom_id":"r%d","method":"POST","url":"/v1/embeddings","body":%s}\n' % (i, body))
    return len(payloads)


def _live(result: Any) -> dict[str, Any]:
    return {**throughput(result), "latency_ms": latency_ms(result.latencies_s)}


async def _job_through(cfg: LoadConfig, source: Path, folder: Path, inflight: int) -> dict[str, Any]:
    out, err = folder / "through.jsonl", folder / "through.errors.jsonl"
    sink = JsonlSink(out, err)
    counts = Counts()
    started = time.perf_counter()
    try:
        async with Sender(cfg.url, headers=auth_headers(cfg.api_key), connections=inflight) as sender:
            await run_job(read_lines(source), sink, sender, counts, max_inflight=inflight)
    finally:
        sink.close(True)
    wall = time.perf_counter() - started
    inputs = counts.completed * cfg.batch_size
    return {
        "lines": counts.completed,
        "failed": counts.failed,
        "tokens": counts.tokens,
        "wall_s": wall,
        "inputs_per_s": rate(inputs, wall),
        "tokens_per_s": rate(counts.tokens, wall),
    }


def _job_in_process(model: str | None, source: Path, folder: Path, inflight: int, batch_size: int) -> dict[str, Any]:
    """``poolgate run-batch`` in its own process; its rates from its last progress line (model start excluded)."""
    command = [
        sys.executable,
        "-m",
        "poolgate.gateway.cli",
        "run-batch",
        "-i",
        str(source),
        "-o",
        str(folder / "in_process.jsonl"),
        "--max-inflight",
        str(inflight),
        "--log-level",
        "WARNING",
    ]
    if model is not None:
        command.append(model)
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    rates = RATE_LINE.findall(proc.stderr)
    if proc.returncode != 0 or not rates:
        return {"error": f"run-batch exited {proc.returncode}: {proc.stderr[-500:]}"}
    done, _, lines_s, tokens_s = (int(x.replace(",", "")) for x in rates[-1])
    return {"lines": done, "inputs_per_s": float(lines_s * batch_size), "tokens_per_s": float(tokens_s)}


def run_jobs_compare(
    cfg: LoadConfig, texts: list[str], *, inflight: int, model: str | None, in_process: bool
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="poolgate-bench-jobs-") as tmp:
        folder = Path(tmp)
        source = folder / "in.jsonl"
        lines = write_job(source, texts, cfg)
        live = _live(asyncio.run(run_load(cfg, texts)))
        through = asyncio.run(_job_through(cfg, source, folder, inflight))
        report: dict[str, Any] = {
            "mode": "jobs",
            "url": cfg.url,
            "batch_size": cfg.batch_size,
            "concurrency": cfg.concurrency,
            "job_inflight": inflight,
            "lines": lines,
            "live": live,
            "job_through_gateway": through,
        }
        report["job_through_gateway"]["ratio_to_live"] = rate(through["tokens_per_s"], live["tokens_per_s"])
        if in_process:
            own = _job_in_process(model, source, folder, inflight, cfg.batch_size)
            if "tokens_per_s" in own:
                own["ratio_to_live"] = rate(own["tokens_per_s"], live["tokens_per_s"])
            report["job_in_process"] = own
        report["errors"] = live["errors"] + through["failed"] + ("error" in report.get("job_in_process", {}))
        return report


def format_jobs(report: dict[str, Any]) -> str:
    rows = [("live (bench)", report["live"])]
    rows.append(("job through the gateway", report["job_through_gateway"]))
    if "job_in_process" in report:
        rows.append(("run-batch in-process", report["job_in_process"]))
    lines = [
        f"{report['lines']:,} requests of {report['batch_size']} inputs; live concurrency "
        f"{report['concurrency']}, job lines in flight {report['job_inflight']}",
        f"{'':26} {'inputs/s':>10} {'tokens/s':>10} {'÷ live':>7}",
    ]
    for name, row in rows:
        if "error" in row:
            lines.append(f"{name:26} {row['error']}")
            continue
        ratio = row.get("ratio_to_live")
        lines.append(
            f"{name:26} {row['inputs_per_s']:>10,.0f} {row['tokens_per_s']:>10,.0f} "
            f"{'' if ratio is None else f'{ratio:.2f}':>7}"
        )
    return "\n".join(lines)


async def _batch_api(session: aiohttp.ClientSession, url: str, content: bytes) -> str:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", content, filename="job.jsonl", content_type="application/jsonl")
    async with session.post(f"{url}/v1/files", data=form) as resp:
        uploaded = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"POST /v1/files -> {resp.status}: {uploaded}")
    body = {"input_file_id": uploaded["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
    async with session.post(f"{url}/v1/batches", json=body) as resp:
        batch = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"POST /v1/batches -> {resp.status}: {batch}")
    return str(batch["id"])


async def _batch(session: aiohttp.ClientSession, url: str, batch_id: str) -> dict[str, Any]:
    async with session.get(f"{url}/v1/batches/{batch_id}") as resp:
        return dict(await resp.json(content_type=None))


async def _until(
    session: aiohttp.ClientSession, url: str, batch_id: str, statuses: tuple[str, ...], every_s: float
) -> dict[str, Any]:
    """The batch once its status is none of ``statuses``, polled every ``every_s``."""
    while True:
        state = await _batch(session, url, batch_id)
        if state["status"] not in statuses:
            return state
        await asyncio.sleep(every_s)


async def _beside(cfg: LoadConfig, live_cfg: LoadConfig, texts: list[str], lines: int, wait: bool) -> dict[str, Any]:
    alone = _live(await run_load(live_cfg, texts))
    with tempfile.TemporaryDirectory(prefix="poolgate-bench-beside-") as tmp:
        source = Path(tmp) / "job.jsonl"
        job_texts = (texts * (lines * cfg.batch_size // max(len(texts), 1) + 1))[: lines * cfg.batch_size]
        write_job(source, job_texts, cfg)
        content = source.read_bytes()
        async with aiohttp.ClientSession(headers=auth_headers(cfg.api_key)) as session:
            batch_id = await _batch_api(session, cfg.url, content)
            state = await _until(session, cfg.url, batch_id, ("validating",), 0.2)
            before = (state.get("request_counts") or {}).get("completed", 0)
            started = time.perf_counter()
            beside = _live(await run_load(replace(live_cfg, warmup=0), texts))
            state = await _batch(session, cfg.url, batch_id)
            job_s = time.perf_counter() - started
            done = (state.get("request_counts") or {}).get("completed", 0) - before
            if wait:
                state = await _until(session, cfg.url, batch_id, ("validating", "in_progress", "finalizing"), 1.0)
            else:
                async with session.post(f"{cfg.url}/v1/batches/{batch_id}/cancel") as resp:
                    await resp.read()
    return {
        "mode": "beside-job",
        "url": cfg.url,
        "live_concurrency": live_cfg.concurrency,
        "job_lines": lines,
        "job_batch_size": cfg.batch_size,
        "live_alone": alone,
        "live_beside_job": beside,
        "job_lines_per_s_beside_live": rate(done, job_s),
        "job_inputs_per_s_beside_live": rate(done * cfg.batch_size, job_s),
        "job_status_at_end": state["status"],
        "errors": alone["errors"] + beside["errors"],
    }


def run_beside_job(cfg: LoadConfig, texts: list[str], lines: int, duration_s: float, wait: bool) -> dict[str, Any]:
    live_cfg = replace(cfg, batch_size=1, duration_s=duration_s)
    return asyncio.run(_beside(cfg, live_cfg, texts, lines, wait))


def format_beside(report: dict[str, Any]) -> str:
    out = [
        f"live 1-input requests at concurrency {report['live_concurrency']}; a Batch API job of "
        f"{report['job_lines']:,} lines x {report['job_batch_size']} inputs",
        f"{'':16} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'requests/s':>11}",
    ]
    for name, key in (("live alone", "live_alone"), ("live beside job", "live_beside_job")):
        row = report[key]
        lat = row["latency_ms"]
        out.append(
            f"{name:16} {lat['p50'] or 0:>8,.1f} {lat['p99'] or 0:>8,.1f} {lat['max'] or 0:>8,.1f} "
            f"{rate(row['inputs'], row['wall_s']):>11,.1f}"
        )
    out.append(
        f"job meanwhile: {report['job_lines_per_s_beside_live']:,.0f} lines/s "
        f"({report['job_inputs_per_s_beside_live']:,.0f} inputs/s); status at the end: "
        f"{report['job_status_at_end']}"
    )
    return "\n".join(out)
