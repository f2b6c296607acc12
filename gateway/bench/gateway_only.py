"""``poolgate bench --gateway-only``: the gateway's own ceiling, against a worker whose model costs nothing.

Starts, on 127.0.0.1, one ``poolgate worker`` serving the zero-cost model
(``poolgate.workers.tools.null_model``: a constant vector; named to the worker by
its factory string, so this client imports nothing of the worker; the gateway
tokenizes with the bundled MiniLM's tokenizer, or with ``--zero-cost-tokenizer
words`` a whitespace split, which leaves tokenizing out of what is measured)
and one ``poolgate serve --worker-url`` in front of it, then runs the HTTP load
at 1 and at 32 inputs per request, in float and in base64, and stops both. What
is left is HTTP, JSON, the dialect, routing, tokenizing, admission, the transport
and the response encoding: requests/s, inputs/s and tokens/s per gateway process. With
``--gateway-processes N`` it then does the same with ``poolgate serve
--gateway-processes N`` (N gateway processes on one port, one /metrics for all
of them), sharing the one worker: the scale-out, measured beside one process in
the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

from poolgate.gateway.bench.load import LoadConfig, run_load
from poolgate.gateway.bench.report import summarize

NULL_FACTORIES = {  # --zero-cost-tokenizer -> the zero-cost model's factory
    "model": "poolgate.workers.tools.null_model:load",  # the bundled MiniLM's tokenizer: tokenizing is measured
    "words": "poolgate.workers.tools.null_model:load_words",  # a whitespace split: the gateway without it
}
MODEL = "null"
SHAPES: tuple[tuple[int, Literal["float", "base64"]], ...] = (  # (inputs per request, encoding)
    (1, "float"),
    (1, "base64"),
    (32, "float"),
    (32, "base64"),
)
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class NullGateway:
    """A running ``null_gateway``: its base URL, its /metrics (every process's requests), API key, processes."""

    url: str
    metrics: str
    key: str
    pids: set[int]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "poolgate.gateway.cli", *args]


def _answer(url: str, key: str) -> dict | None:
    """``/admin/pools`` of the gateway process a fresh connection reaches, or None while it does not answer."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(request, timeout=2) as resp:
        return json.loads(resp.read())
    return None


def _wait_ready(url: str, key: str, processes: int, procs: list[subprocess.Popen]) -> set[int]:
    """Until ``processes`` distinct gateway processes answered on the port with the null model's worker ready;
    their pids."""
    deadline, ready = time.monotonic() + READY_TIMEOUT_S, set[int]()
    while len(ready) < processes:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("the zero-cost worker or the gateway exited before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(ready)} of {processes} gateway processes ready within {READY_TIMEOUT_S:.0f} s")
        answer = _answer(f"{url}/admin/pools", key)
        if answer is not None and all(model["ready"] for model in answer["data"]) and answer["data"]:
            ready.add(answer["pid"])
        else:
            time.sleep(0.1)
    return ready


@contextlib.contextmanager
def null_gateway(processes: int = 1, tokenizer: str = "model") -> Iterator[NullGateway]:
    """``poolgate serve --gateway-processes N`` on a free port in front of one zero-cost worker, every process
    ready (an admin key of its own finds each one's pid)."""
    worker_port, http_port, metrics_port = free_port(), free_port(), free_port()
    key = secrets.token_urlsafe(16)
    worker = ["--served-model-name", MODEL, "--listen", f"tcp://127.0.0.1:{worker_port}"]
    procs = [
        subprocess.Popen(
            _cli("worker", *worker, "--runner-factory", NULL_FACTORIES[tokenizer]), stderr=subprocess.DEVNULL
        )
    ]
    serve = ["--host", "127.0.0.1", "--port", str(http_port), "--metrics-port", str(metrics_port), "--api-key", key]
    serve += ["--gateway-processes", str(processes), "--worker-url", f"tcp://127.0.0.1:{worker_port}"]
    procs.append(subprocess.Popen(_cli("serve", *serve), stderr=subprocess.DEVNULL))
    url = f"http://127.0.0.1:{http_port}"
    try:
        pids = _wait_ready(url, key, processes, procs)
        yield NullGateway(url, f"http://127.0.0.1:{metrics_port}/metrics", key, pids)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def run_gateway_only(base: LoadConfig, texts: list[str], processes: int = 1, tokenizer: str = "model") -> dict:
    """Every (batch size, encoding) of ``SHAPES`` against one zero-cost worker behind one gateway process, then
    (``processes`` > 1) behind that many on one port: the report. ``tokenizer``: a key of ``NULL_FACTORIES``."""
    runs = []
    for n in sorted({1, processes}):
        with null_gateway(n, tokenizer) as gateway:
            for batch, encoding in SHAPES:
                cfg = replace(base, url=gateway.url, model=MODEL, batch_size=batch, encoding_format=encoding)
                cfg = replace(cfg, api_key=gateway.key)
                result = asyncio.run(run_load(cfg, texts))
                runs.append(
                    {**summarize(result, cfg, corpus="synthetic", num_texts=len(texts)), "gateway_processes": n}
                )
    return {
        "mode": "gateway-only",
        "tokenizer": tokenizer,
        "concurrency": base.concurrency,
        "texts": len(texts),
        "runs": runs,
        "errors": sum(r["errors"] for r in runs),
    }


def format_gateway_only(report: dict) -> str:
    lines = [
        f"poolgate bench --gateway-only: zero-cost worker, {report['texts']:,} texts, "
        f"concurrency {report['concurrency']}, tokenizer: {report.get('tokenizer', 'model')}",
        f"  {'gateways':>8}  {'inputs/request':>14}  {'encoding':>8}  {'requests/s':>12}  {'inputs/s':>12}  "
        f"{'tokens/s':>12}  {'p50 ms':>8}  errors",
    ]
    for r in report["runs"]:
        lines.append(
            f"  {r.get('gateway_processes', 1):>8}  {r['batch_size']:>14}  {r['encoding_format']:>8}  "
            f"{r['requests_per_s']:>12,.1f}  "
            f"{r['inputs_per_s']:>12,.1f}  {r['tokens_per_s']:>12,.0f}  {r['latency_ms']['p50'] or 0:>8.2f}  "
            f"{r['errors']}"
        )
    return "\n".join(lines)
