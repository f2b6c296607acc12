"""A soak on a live `poolgate serve` of the bundled model: resident memory of the gateway and its worker flat
after warm-up under steady load (``gateway.bench.soak``: 4 clients x 16 inputs, each input cut to a random
length, so every batch has a new token count: the load that grew the worker from 471 MB to 1.7 GB).

"Flat" is measured as the soak reports it: over the second half of the run (after 90 s of warm-up), each
process's highest sample minus its first, at most ``GROWTH_BOUND_MB``. Measured once on the shared 2-core
machine (2026-12-01, 3,944 requests answered): the gateway 65.7 -> 67.1 MB (second half +0.06 MB), the
worker 407 -> 469 MB, nearly all of it in the first 20 s, then between 447 and 477 MB (second half +7.8 MB). The
bound, 100 MB, is twelve times that growth and three times the samples' spread; unbounded, the worker
grew about 1.2 GB in the same three minutes.
"""
from __future__ import annotations

import asyncio

import pytest

from poolgate.gateway.bench import soak
from poolgate.shared.config.models import DEFAULT_MODEL_NAME
from tests.live_server import live_server

DURATION_S, EVERY_S = 180.0, 10.0
GROWTH_BOUND_MB = 100.0


@pytest.mark.slow
def test_resident_memory_is_flat_after_warm_up_under_steady_load(tmp_path):
    with live_server(tmp_path) as server:
        workers = server.workers()
        report = asyncio.run(soak.run(server.url, DEFAULT_MODEL_NAME, server.proc.pid, duration_s=DURATION_S,
                                      every_s=EVERY_S))
        print(f"soak {DURATION_S:.0f}s: answered {report['answered']}; first {report['first']}; "
              f"last {report['last']}; second-half growth (MB) {report['second_half_growth_mb']}")
        assert server.proc.poll() is None and sorted(server.workers()) == sorted(workers)  # nothing restarted
    growth = report["second_half_growth_mb"]
    assert {f"worker {w}" for w in workers} <= set(growth), growth  # every worker was sampled
    assert report["answered"] > 0
    assert all(mb <= GROWTH_BOUND_MB for mb in growth.values()), growth
