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
``--gateway-processes N`` it then does the same with N gateway processes on one
port (``--reuse-port``, each with its own metrics port), sharing the one worker:
the scale-out, measured beside one process in the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from typing import Literal

from poolgate.gateway.bench.load import LoadConfig, run_load
from poolgate.gateway.bench.report import summarize
from poolgate.shared.telemetry import WORKER_UP

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "poolgate.gateway.cli", *args]


def _ready(url: str) -> bool:
    """A gateway's /metrics with its worker up (it serves the model), or the API's /health answering 200."""
    with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(url, timeout=2) as resp:
        if resp.status != 200:
            return False
        if not url.endswith("/metrics"):
            return True
        return any(
            line.startswith(f"{WORKER_UP}{{") and line.rstrip().endswith(" 1.0")
            for line in resp.read().decode().splitlines()
        )
    return False


def _wait_ready(urls: list[str], procs: list[subprocess.Popen]) -> None:
    """Until every URL is ready (each gateway's own metrics port, then the shared API port)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("the zero-cost worker or a gateway exited before it was ready")
        if _ready(pending[0]):
            pending.pop(0)
            continue
        time.sleep(0.2)
    if pending:
        raise RuntimeError(f"{pending[0]} was not ready within {READY_TIMEOUT_S:.0f} s")


@contextlib.contextmanager
def null_gateway(processes: int = 1, tokenizer: str = "model") -> Iterator[tuple[str, list[str]]]:
    """``processes`` gateways on one free port in front of one zero-cost worker; yields the base URL and each
    gateway's own /metrics URL."""
    worker_port, http_port = free_port(), free_port()
    procs = [
        subprocess.Popen(
            _cli(
                "worker",
                "--served-model-name",
                MODEL,
                "--listen",
                f"tcp://127.0.0.1:{worker_port}",
                "--runner-factory",
                NULL_FACTORIES[tokenizer],
            ),
            stderr=subprocess.DEVNULL,
        )
    ]
    metrics = []
    for _ in range(processes):
        metrics_port = free_port()
        metrics.append(f"http://127.0.0.1:{metrics_port}/metrics")
        procs.append(
            subprocess.Popen(
                _cli(
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(http_port),
                    "--reuse-port",
                    "--metrics-port",
                    str(metrics_port),
                    "--worker-url",
                    f"tcp://127.0.0.1:{worker_port}",
                ),
                stderr=subprocess.DEVNULL,
            )
        )
    url = f"http://127.0.0.1:{http_port}"
    try:
        _wait_ready([*metrics, f"{url}/health"], procs)
        yield url, metrics
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
        with null_gateway(n, tokenizer) as (url, _):
            for batch, encoding in SHAPES:
                cfg = replace(base, url=url, model=MODEL, batch_size=batch, encoding_format=encoding)
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
