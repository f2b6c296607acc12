"""A `poolgate serve` of the bundled model as a real process on loopback, for the load and fuzz tests."""
from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from poolgate.shared.config.models import DEFAULT_MODEL_NAME
from poolgate.shared.telemetry.names import WORKER_TOKENS_PER_S
from tests.environment import clean_env
from tests.processes import children, free_port, wait_healthy


@dataclass
class LiveServer:
    url: str
    proc: subprocess.Popen
    log: Path  # the server's stderr (gateway and workers)

    def workers(self) -> list[int]:
        return children(self.proc.pid)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def pools(self, headers: dict) -> list[dict]:
        """The first model's workers as ``/admin/pools`` shows them (needs the admin key)."""
        model = requests.get(f"{self.url}/admin/pools", headers=headers, timeout=10).json()["data"][0]
        return [w for pool in model["pools"] for w in pool["workers"]]

    def capacity(self, headers: dict, timeout_s: float = 20) -> float:
        """The pool's measured tokens/s (what admission uses), once every ready worker has measured one."""
        deadline = time.time() + timeout_s
        while True:
            rates = [w["tokens_per_s"] for w in self.pools(headers) if w["state"] == "ready"]
            if rates and all(r > 0 for r in rates):
                return float(sum(rates))
            assert time.time() < deadline, f"no measured capacity after {timeout_s}s: {self.pools(headers)}"
            time.sleep(0.5)

    def warm_up(self, calls: list[list[str]], headers: dict | None = None) -> float:
        """Embed each of ``calls`` (its inputs) in turn, so the worker measures its rate on batches of that size;
        the prompt tokens an input counted, on average."""
        tokens = 0
        for inputs in calls:
            body = {"model": DEFAULT_MODEL_NAME, "input": inputs, "encoding_format": "base64",
                    "truncate_prompt_tokens": -1}
            r = requests.post(f"{self.url}/v1/embeddings", headers=headers, timeout=120, json=body)
            assert r.status_code == 200, r.text
            tokens += r.json()["usage"]["prompt_tokens"]
        return tokens / sum(map(len, calls))

    def metrics_capacity(self, timeout_s: float = 20) -> float:
        """The same from /metrics (open without a key): the sum of the workers' measured tokens/s, once each
        worker has one."""
        deadline = time.time() + timeout_s
        while True:
            text = requests.get(f"{self.url}/metrics", timeout=10).text
            rates = [float(r) for r in re.findall(rf"^{WORKER_TOKENS_PER_S}{{.*}} (\S+)$", text, re.M)]
            if rates and all(r > 0 for r in rates):
                return sum(rates)
            assert time.time() < deadline, f"no measured capacity after {timeout_s}s: {rates}"
            time.sleep(0.25)


@contextlib.contextmanager
def live_server(tmp: Path, *flags: str, ready_s: float = 180):
    """Start ``poolgate serve --port P *flags`` (without the caller's settings: ``tests.environment``) and stop
    it with SIGTERM on exit (a clean exit is asserted)."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--host", "127.0.0.1",
                                 "--port", str(port), *flags], stdout=subprocess.DEVNULL, stderr=err,
                                env=clean_env())
    server = LiveServer(f"http://127.0.0.1:{port}", proc, log)
    try:
        try:
            wait_healthy(server.url, ready_s, proc)
        except (AssertionError, TimeoutError) as err:
            raise AssertionError(f"{err}\n{server.log_text()[-3000:]}") from None
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def served_url(tmp: Path, *flags: str):
    """For a module fixture, ``yield from`` it: a live server's URL, then (at teardown) its clean exit asserted."""
    with live_server(tmp, *flags) as server:
        yield server.url
    assert server.proc.returncode == 0, f"exit {server.proc.returncode}\n{server.log_text()[-3000:]}"
