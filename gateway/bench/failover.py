"""``poolgate bench --kill-worker-after S --gateway-pid PID``: SIGKILL one local worker mid-run, time the recovery.

While the load runs, after ``S`` seconds one worker process of the gateway
``PID`` (a child running ``poolgate.workers.main``) gets SIGKILL. The gateway's
``/metrics`` (``poolgate_worker_up``: one series per worker, 1 when it answers
and is in rotation) is polled every ``POLL_S``: the pool is whole again when as
many workers are up as before the kill and a new worker process has replaced the
killed one. The watch goes on after the load ends, up to ``max_wait_s`` after
the kill. The report gets a ``failover`` entry: the killed pid, when it was
killed (seconds into the run), how long until the gateway saw a worker down and
until the pool was whole again (None when it was not within ``max_wait_s``), and
whether that happened while the load still ran. Linux only (``/proc``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

POLL_S = 0.1
WORKER_UP = "poolgate_worker_up"
WORKER_MODULE = b"poolgate.workers.main"


@dataclass(frozen=True)
class KillPlan:
    """Whom to kill and when; ``metrics_url`` serves the gateway's Prometheus text."""

    gateway_pid: int
    after_s: float
    metrics_url: str
    max_wait_s: float = 180.0


def worker_pids(gateway_pid: int) -> list[int]:
    """The gateway's worker processes: descendants (a launcher such as ``timeout`` or a pyenv shim may sit
    between) whose command line runs ``poolgate.workers.main``."""
    found, todo = set(), [gateway_pid]
    while todo:
        pid = todo.pop()
        for children in Path(f"/proc/{pid}/task").glob("*/children"):
            try:
                kids = [int(p) for p in children.read_text().split()]
            except OSError:  # the thread or process ended meanwhile
                continue
            found.update(kids)
            todo += [k for k in kids if WORKER_MODULE not in _cmdline(k)]
    return sorted(p for p in found if WORKER_MODULE in _cmdline(p))


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def workers_up(metrics_text: str) -> int:
    """How many ``poolgate_worker_up`` series are 1."""
    return sum(
        1
        for family in text_string_to_metric_families(metrics_text)
        if family.name == WORKER_UP
        for sample in family.samples
        if sample.value == 1.0
    )


async def _up(session: aiohttp.ClientSession, url: str) -> int | None:
    try:
        async with session.get(url) as resp:
            return workers_up(await resp.text()) if resp.status == 200 else None
    except (TimeoutError, aiohttp.ClientError):
        return None


async def kill_and_watch(plan: KillPlan, run_done: asyncio.Event) -> dict:
    """Wait ``plan.after_s``, SIGKILL the gateway's first worker, and time the pool's recovery."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        start = time.perf_counter()
        await asyncio.sleep(plan.after_s)
        before_pids, before_up = worker_pids(plan.gateway_pid), await _up(session, plan.metrics_url)
        if not before_pids:
            return {"error": f"no worker process under pid {plan.gateway_pid}"}
        victim = before_pids[0]
        os.kill(victim, signal.SIGKILL)
        killed = time.perf_counter()
        down_s = whole_s = None
        while whole_s is None and time.perf_counter() - killed < plan.max_wait_s:
            await asyncio.sleep(POLL_S)
            up = await _up(session, plan.metrics_url)
            now = time.perf_counter() - killed
            if down_s is None and up is not None and before_up is not None and up < before_up:
                down_s = now
            replaced = len(set(worker_pids(plan.gateway_pid)) - set(before_pids)) > 0
            if replaced and up is not None and before_up is not None and up >= before_up:
                whole_s = now
    return {
        "killed_pid": victim,
        "killed_at_s": killed - start,
        "workers_up_before": before_up,
        "down_seen_after_s": down_s,
        "whole_again_after_s": whole_s,
        "whole_while_loaded": whole_s is not None and not run_done.is_set(),
    }


def format_failover(result: dict) -> str:
    """One line for the table: whom it killed and how long the pool took to be whole again."""
    if "error" in result:
        return f"failover: {result['error']}"

    def secs(x: float | None) -> str:
        return "never (within the wait)" if x is None else f"{x:.2f} s"

    return (
        f"failover: SIGKILL worker {result['killed_pid']} at {result['killed_at_s']:.1f} s; "
        f"seen down after {secs(result['down_seen_after_s'])}; "
        f"pool whole again after {secs(result['whole_again_after_s'])}"
        f"{'' if result['whole_while_loaded'] else ' (after the load ended)'}"
    )


T = TypeVar("T")


async def run_with_kill(load: Awaitable[T], plan: KillPlan) -> tuple[T, dict[str, Any]]:
    """Run the awaitable ``load`` while ``kill_and_watch`` does its work; both results."""
    run_done = asyncio.Event()
    watcher = asyncio.ensure_future(kill_and_watch(plan, run_done))
    try:
        result = await load
    finally:
        run_done.set()
    return result, await watcher
