"""Quota cells shared by real processes: a tenant's bucket and its count in flight hold across two of them."""
from __future__ import annotations

import multiprocessing
import time

from poolgate.gateway.http.quota_cells import SharedCells, Tally
from poolgate.gateway.http.tenants import Bucket

PER_MINUTE = 600  # 10 units a second refill, so the test's second adds about 10 to the 600
TAKERS, TAKE_S = 2, 1.0
CAP = 7


def _take(path: str, start: float, taken) -> None:
    """One process: take one unit at a time from the shared bucket for ``TAKE_S`` from ``start``."""
    bucket = Bucket(PER_MINUTE, cells=SharedCells(path, 2, create=False))
    while time.time() < start:
        time.sleep(0.001)
    n = 0
    while time.time() < start + TAKE_S:
        n += bucket.take_if(1) == 0.0
    taken.put(n)


def _enter(path: str, start: float, entered) -> None:
    """One process: try to count 50 requests in against the shared cap."""
    tally = Tally(SharedCells(path, 1, create=False))
    while time.time() < start:
        time.sleep(0.001)
    entered.put(sum(tally.enter(CAP) for _ in range(50)))


def _run(target, path: str) -> list[int]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 2.0  # both started (spawn imports) before either takes
    procs = [ctx.Process(target=target, args=(path, start, out)) for _ in range(TAKERS)]
    for p in procs:
        p.start()
    counts = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    return counts


def test_two_processes_taking_at_once_get_one_buckets_worth_together(tmp_path):
    path = tmp_path / "cells"
    parent = Bucket(PER_MINUTE, cells=SharedCells(path, 2, create=True))  # fills it: 600 units
    assert parent.level == PER_MINUTE
    counts = _run(_take, str(path))
    refilled = PER_MINUTE / 60 * (TAKE_S + 0.5)  # the most that refilled while they took (it was full before)
    assert all(c > 0 for c in counts), counts  # both took
    assert PER_MINUTE <= sum(counts) <= PER_MINUTE + refilled, counts  # each alone would have had 600


def test_two_processes_entering_at_once_count_up_to_one_cap(tmp_path):
    path = tmp_path / "cells"
    tally = Tally(SharedCells(path, 1, create=True))
    assert sum(_run(_enter, str(path))) == CAP and tally.value == CAP
    tally.leave()
    assert tally.enter(CAP) and not tally.enter(CAP)
