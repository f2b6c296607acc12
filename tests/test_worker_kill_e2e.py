"""A worker SIGKILLed mid-load in a 2-worker `poolgate serve`: every accepted request is still answered (the
gateway retries the dead worker's calls on the other one), and the pool serves on afterwards.

Admission is off (``--max-queued-seconds 0``) so every request is accepted: each one must come back 200
with its vectors. The load is open-loop at about half the two workers' measured capacity (at least 3
requests/s); the worker killed is one that has calls in flight at that moment (``/admin/pools``), so there
is work to lose.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import requests

from poolgate.shared.config.models import DEFAULT_MODEL_NAME
from tests.live_server import live_server
from tests.load_client import open_loop, percentile, texts
from tests.processes import alive

KEY = "kill-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
DURATION_S = 10.0
KILL_AFTER_S = 3.0
N_INPUTS = 64  # calls long enough (~0.1-0.3 s) that the one killed is still running


def _embed_body() -> dict:
    return {"model": DEFAULT_MODEL_NAME, "input": texts(N_INPUTS), "encoding_format": "base64"}


def _warm_both(url: str) -> int:
    """Concurrent requests until each worker has run batches; the prompt tokens of one request."""
    async def burst():
        return await open_loop(f"{url}/v1/embeddings", 20, 1.0, _embed_body, headers=AUTH)
    outcomes = asyncio.run(burst())
    assert all(o.status == 200 for o in outcomes), [o.body for o in outcomes if o.status != 200][:3]
    return outcomes[0].body["usage"]["prompt_tokens"]


def _worker_pids_by_address(server) -> dict[str, int]:
    by_address = {}
    for pid in server.workers():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        if "--listen" in argv:
            by_address[argv[argv.index("--listen") + 1]] = pid
    return by_address


class Killer(threading.Thread):
    """After ``KILL_AFTER_S``, SIGKILL the worker with the most calls in flight (two if it comes to that soon)."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.server, self.pid, self.in_flight, self.at = server, None, 0, None

    def run(self) -> None:
        start = time.monotonic()
        time.sleep(KILL_AFTER_S)
        pids = _worker_pids_by_address(self.server)
        while time.monotonic() - start < DURATION_S - 2:
            busiest = max(self.server.pools(AUTH), key=lambda w: w["calls_in_flight"])
            wanted = 2 if time.monotonic() - start < KILL_AFTER_S + 2 else 1  # more than one lost call if it can
            if busiest["calls_in_flight"] >= wanted and busiest["address"] in pids:
                self.pid, self.in_flight = pids[busiest["address"]], busiest["calls_in_flight"]
                os.kill(self.pid, signal.SIGKILL)
                self.at = time.monotonic() - start
                return
            time.sleep(0.05)


def test_a_worker_killed_mid_load_loses_no_accepted_request(tmp_path):
    with live_server(tmp_path, "--workers", "2", "--api-key", KEY, "--max-queued-seconds", "0",
                     "--health-check-interval", "0.5") as server:
        assert len(_worker_pids_by_address(server)) == 2
        tokens = _warm_both(server.url)
        rate = max(0.5 * server.capacity(AUTH) / tokens, 3.0)
        killer = Killer(server)
        killer.start()
        outcomes = asyncio.run(open_loop(f"{server.url}/v1/embeddings", rate, DURATION_S, _embed_body,
                                         headers=AUTH))
        killer.join()

        lost = [o for o in outcomes if o.status != 200 or len(o.body["data"]) != N_INPUTS]
        around = [o for o in outcomes if killer.at and killer.at - 2 <= o.sent_at <= killer.at]
        print(f"worker kill: {len(outcomes)} requests at {rate:.1f} req/s x {N_INPUTS} inputs; worker {killer.pid} "
              f"killed at {killer.at:.1f}s with {killer.in_flight} calls in flight "
              f"({server.log_text().count('retrying ')} retries logged); lost {len(lost)}; p99 "
              f"{percentile([o.latency_s for o in outcomes], 0.99):.2f}s (sent in the 2 s before the kill: "
              f"p99 {percentile([o.latency_s for o in around], 0.99):.2f}s)")
        assert killer.pid is not None, "no worker had calls in flight to kill"
        assert not alive(killer.pid)
        assert not lost, [(o.status, str(o.body)[:200]) for o in lost[:5]]
        assert server.proc.poll() is None
        r = requests.post(f"{server.url}/v1/embeddings", headers=AUTH, json=_embed_body(), timeout=60)
        assert r.status_code == 200 and len(r.json()["data"]) == N_INPUTS
