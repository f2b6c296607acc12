"""``poolgate bench --kill-worker-after``: finding the gateway's workers, reading worker_up, timing the recovery."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
from aiohttp import web

from poolgate.gateway.bench.failover import KillPlan, format_failover, kill_and_watch, worker_pids, workers_up
from tests.fakes import until
from tests.processes import alive

# A stand-in gateway: two "worker" children (their argv names poolgate.workers.main), each restarted 0.3 s after it dies.
FAKE_GATEWAY = textwrap.dedent("""
    import subprocess, sys, time
    cmd = [sys.executable, "-c", "import time; time.sleep(60)", "poolgate.workers.main"]
    procs = [subprocess.Popen(cmd) for _ in range(2)]
    print("ready", flush=True)
    while True:
        for i, p in enumerate(procs):
            if p.poll() is not None:
                time.sleep(0.3)
                procs[i] = subprocess.Popen(cmd)
        time.sleep(0.02)
""")


def test_workers_up_counts_the_series_at_one():
    text = ('# TYPE poolgate_worker_up gauge\n'
            'poolgate_worker_up{model="m",backend="cpu",worker="a"} 1.0\n'
            'poolgate_worker_up{model="m",backend="cpu",worker="b"} 0.0\n'
            'poolgate_worker_up{model="n",backend="cpu",worker="c"} 1.0\n'
            '# TYPE poolgate_requests_in_flight gauge\npoolgate_requests_in_flight{model="m"} 1.0\n')
    assert workers_up(text) == 2


@pytest.fixture
def fake_gateway():
    proc = subprocess.Popen([sys.executable, "-c", FAKE_GATEWAY], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    children = worker_pids(proc.pid)
    proc.kill()
    proc.wait()
    for pid in children:
        subprocess.run(["kill", "-9", str(pid)], check=False)


async def test_kill_and_watch_times_the_recovery(fake_gateway, live_server):
    pid = fake_gateway.pid
    await until(lambda: len(worker_pids(pid)) == 2, 5)
    first = worker_pids(pid)

    async def metrics(request: web.Request) -> web.Response:
        lines = [f'poolgate_worker_up{{worker="{p}"}} 1.0' for p in worker_pids(pid)]
        return web.Response(text="# TYPE poolgate_worker_up gauge\n" + "\n".join(lines) + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    url = await live_server(app)
    done = asyncio.Event()
    result = await asyncio.wait_for(kill_and_watch(KillPlan(pid, 0.1, f"{url}/metrics"), done), 10)
    assert result["killed_pid"] == first[0] and not alive(first[0])
    assert result["workers_up_before"] == 2
    assert 0 < result["down_seen_after_s"] < result["whole_again_after_s"] < 5
    assert result["whole_again_after_s"] >= 0.3  # the stand-in waits 0.3 s before restarting
    assert len(worker_pids(pid)) == 2 and first[0] not in worker_pids(pid)
    assert result["whole_while_loaded"] and "pool whole again after" in format_failover(result)


async def test_no_worker_to_kill_is_reported():
    result = await kill_and_watch(KillPlan(999_999_999, 0, "http://127.0.0.1:9/metrics"), asyncio.Event())
    assert "no worker process" in result["error"]


def test_kill_without_a_gateway_pid_cannot_start(capsys):
    import argparse

    from poolgate.gateway.bench.cli import add_arguments, main

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--url", "http://127.0.0.1:9", "--model", "m", "--kill-worker-after", "5"])
    assert main(args) == 2
    assert "--kill-worker-after needs --gateway-pid" in capsys.readouterr().err
