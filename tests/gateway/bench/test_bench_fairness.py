"""The fairness bench (``gateway.bench.fairness``) against a live app over a real (fake-model) worker."""
from __future__ import annotations

import pytest

from poolgate.gateway.app import make_app
from poolgate.gateway.bench import fairness
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import fake_model
from tests.gateway.conftest import served_router


@pytest.mark.parametrize("scenario", ["big", "bulk"])
async def test_the_probe_is_timed_beside_the_heavy_load(live_server, scenario):
    async with served_router([fake_model(max_batch_tokens=512)]) as router:
        url = await live_server(make_app(GatewayConfig(), router))
        report = await fairness.run(url, "fake-model", scenario, duration_s=0.6, lead_s=0.2, big_inputs=300,
                                    bulk_clients=2, bulk_inputs=16)
    assert report["scenario"] == scenario and report["probes"] > 0 and report["probe_errors"] == 0
    assert 0 < report["p50_s"] <= report["p99_s"] <= report["max_s"] and report["heavy_inputs_per_s"] > 0
    assert report["heavy_calls"] > 0 and report["heavy_errors"] == 0 and report["heavy_p50_s"] > 0  # their own time


async def test_the_probing_ends_after_the_probes_asked_for(live_server):
    async with served_router([fake_model(max_batch_tokens=512)]) as router:
        url = await live_server(make_app(GatewayConfig(), router))
        report = await fairness.run(url, "fake-model", "bulk", duration_s=30, lead_s=0.1, bulk_clients=2,
                                    bulk_inputs=16, probes=3)
    assert report["probes"] == 3 and report["probe_errors"] == 0
