"""The soak bench (``gateway.bench.soak``) against a live app over a real (fake-model) worker, briefly."""
from __future__ import annotations

import os

from poolgate.gateway.app import make_app
from poolgate.gateway.bench import soak
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import fake_model
from tests.gateway.conftest import served_router


async def test_it_loads_the_server_and_samples_resident_memory(live_server):
    async with served_router([fake_model(max_batch_tokens=512)]) as router:
        url = await live_server(make_app(GatewayConfig(), router))
        report = await soak.run(url, "fake-model", os.getpid(), duration_s=0.6, every_s=0.2, clients=2, inputs=4)
    assert report["answered"] > 0 and len(report["samples"]) >= 3
    assert report["first"]["gateway"] > 0 and "gateway" in report["second_half_growth_mb"]


def test_rss_of_a_process_that_is_gone_is_none():
    assert soak.rss_mb(2 ** 22 + 12345) is None and soak.children(2 ** 22 + 12345) == []
