"""`poolgate serve --gateway-processes 2` on the bundled model: two gateway processes on one port, one worker.

Fresh connections reach both processes (the answering pid is in /admin/pools); a scrape of either counts the
requests of both and the one worker once; a tenant's token quota holds across them; SIGTERM stops both
cleanly, and a sibling dies with a killed parent (no orphans).
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest
import requests

from poolgate.shared.config.models import DEFAULT_MODEL_NAME
from poolgate.shared.telemetry.names import POOL_ADMITTED, POOL_QUEUED_TOKENS, REQUESTS, WORKER_UP
from tests.live_server import live_server
from tests.processes import alive

ADMIN_KEY, TENANT_KEY = "sk-admin-processes-1", "sk-capped-processes-1"
TOKENS_PER_MINUTE = 600
KEYS_FILE = f"""
[[tenants]]
name = "capped"
keys = ["{TENANT_KEY}"]
tokens_per_minute = {TOKENS_PER_MINUTE}
"""
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TEXT = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="--gateway-processes needs Linux (SO_REUSEPORT)")


def _pid(url: str) -> int:
    """The pid of the gateway process a fresh connection reached."""
    return requests.get(f"{url}/admin/pools", headers=ADMIN, timeout=10).json()["pid"]


def _both_pids(url: str, timeout_s: float = 30) -> set[int]:
    """Fresh connections until two processes answered (the sibling starts once the parent's workers are up)."""
    deadline, pids = time.time() + timeout_s, set()
    while len(pids) < 2:
        assert time.time() < deadline, f"only {pids} answered in {timeout_s}s"
        try:
            pids.add(_pid(url))
        except (requests.ConnectionError, ValueError):  # a sibling killed or not ready yet
            time.sleep(0.1)
    return pids


def _gone(pids, timeout_s: float = 15) -> None:
    deadline = time.time() + timeout_s
    while any(map(alive, pids)) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(map(alive, pids)), [p for p in pids if alive(p)]


def _embed(url: str, key: str) -> requests.Response:
    body = {"model": DEFAULT_MODEL_NAME, "input": TEXT}
    return requests.post(f"{url}/v1/embeddings", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _sample(metrics: str, name: str, **labels: str) -> list[float]:
    out = []
    for line in metrics.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            out.append(float(m.group(2)))
    return out


def _keys(tmp_path) -> str:
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS_FILE)
    return str(keys)


def test_two_processes_share_one_port_metrics_and_a_tenants_quota(tmp_path):
    flags = ("--gateway-processes", "2", "--api-key", ADMIN_KEY, "--api-keys-file", _keys(tmp_path))
    with live_server(tmp_path, *flags) as server:
        pids = _both_pids(server.url)
        assert server.proc.pid in pids  # the parent, and one sibling
        seen = {_pid(server.url) for _ in range(20)}
        assert seen == pids  # fresh connections keep reaching both

        sent = 20
        assert all(_embed(server.url, ADMIN_KEY).status_code == 200 for _ in range(sent))
        for _ in range(6):  # any process's scrape: both processes' requests, the one worker once
            text = requests.get(f"{server.url}/metrics", timeout=10).text
            assert _sample(text, f"{REQUESTS}_total", route="/v1/embeddings", status="200") == [sent]
            assert _sample(text, WORKER_UP) == [1.0]
        deadline = time.monotonic() + 5  # each process publishes its pool series every second (and at its scrapes)
        while _sample(text, f"{POOL_ADMITTED}_total", lane="live") != [sent] and time.monotonic() < deadline:
            time.sleep(0.2)
            text = requests.get(f"{server.url}/metrics", timeout=10).text
        assert _sample(text, f"{POOL_ADMITTED}_total", lane="live") == [sent]  # summed over both processes
        assert _sample(text, POOL_QUEUED_TOKENS, lane="live") == [0]  # every call answered, in both

        started, accepted, tokens = time.monotonic(), 0, 0
        for _ in range(120):  # ~2x the quota offered to each process
            r = _embed(server.url, TENANT_KEY)
            assert r.status_code in (200, 429), r.text
            if r.status_code == 200:
                accepted, tokens = accepted + 1, tokens + r.json()["usage"]["prompt_tokens"]
        refill = TOKENS_PER_MINUTE / 60 * (time.monotonic() - started)
        per_request = tokens / accepted
        # one shared bucket: what it held, what refilled, and the one request that may take it into debt;
        # a bucket per process would have let each take its 600
        assert TOKENS_PER_MINUTE - per_request <= tokens <= TOKENS_PER_MINUTE + refill + per_request, (tokens, refill)

        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0, server.log_text()[-3000:]
        _gone(pids - {server.proc.pid})


def test_a_killed_sibling_is_started_again_and_a_sibling_dies_with_a_killed_parent(tmp_path):
    with live_server(tmp_path, "--gateway-processes", "2", "--api-key", ADMIN_KEY) as server:
        first = (_both_pids(server.url) - {server.proc.pid}).pop()
        os.kill(first, signal.SIGKILL)
        _gone([first])
        sibling = (_both_pids(server.url) - {server.proc.pid, first}).pop()  # the parent started another
        assert "gateway process 1 (pid" in server.log_text()
        workers = server.workers()
        server.proc.kill()
        server.proc.wait(timeout=10)
        _gone([sibling, *workers])
