"""Drain on SIGTERM: readiness 503, new requests 503 with Retry-After, calls in flight finish, then stop."""
from __future__ import annotations

import asyncio
import time

from poolgate.gateway.pools.drain import Drain
from poolgate.gateway.http.state import ROUTER
from tests.fakes import fake_model


async def test_drain_refuses_new_work_and_stops_once_the_calls_in_flight_are_done(gateway):
    model = fake_model()
    model.runner.release.clear()  # hold the first batch on the "device"
    client = await gateway(models=[model])
    stopped = asyncio.Event()
    drain = Drain(client.app[ROUTER], timeout_s=10, stop=stopped.set)
    held = asyncio.create_task(client.post("/v1/embeddings", json={"input": "in flight"}))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    drain.begin()
    health = await client.get("/health")
    assert health.status == 503
    late = await client.post("/v1/embeddings", json={"input": "late"})
    assert late.status == 503 and late.headers["Retry-After"] == "1"
    assert (await late.json())["error"]["type"] == "ServiceUnavailableError"
    await asyncio.sleep(0.05)
    assert not stopped.is_set()
    model.runner.release.set()
    resp = await held
    assert resp.status == 200 and len((await resp.json())["data"]) == 1
    await asyncio.wait_for(stopped.wait(), 2)


async def test_drain_gives_up_after_its_timeout(gateway):
    model = fake_model()
    model.runner.release.clear()
    client = await gateway(models=[model])
    stopped = asyncio.Event()
    drain = Drain(client.app[ROUTER], timeout_s=0.2, stop=stopped.set)
    held = asyncio.create_task(client.post("/v1/embeddings", json={"input": "stuck"}))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    started = time.monotonic()
    drain.begin()
    await asyncio.wait_for(stopped.wait(), 2)
    assert 0.15 < time.monotonic() - started < 1.5
    model.runner.release.set()
    await held


async def test_a_second_signal_stops_at_once(gateway):
    model = fake_model()
    model.runner.release.clear()
    client = await gateway(models=[model])
    stops = []
    drain = Drain(client.app[ROUTER], timeout_s=30, stop=lambda: stops.append(time.monotonic()))
    held = asyncio.create_task(client.post("/v1/embeddings", json={"input": "stuck"}))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    drain.begin()
    await asyncio.sleep(0.05)
    assert stops == []
    drain.begin()
    await asyncio.sleep(0.01)
    assert len(stops) == 1
    model.runner.release.set()
    await held


async def test_with_nothing_in_flight_it_stops_right_away(gateway):
    client = await gateway()
    stopped = asyncio.Event()
    Drain(client.app[ROUTER], timeout_s=30, stop=stopped.set).begin()
    await asyncio.wait_for(stopped.wait(), 1)


def test_drain_and_health_check_settings_from_flags_and_from_a_config_file(tmp_path):
    import argparse

    from poolgate.gateway import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    flags = serve.config_from_args(parser.parse_args(
        ["--drain-timeout", "5", "--health-check-interval", "0.5", "--health-check-timeout", "2"]))
    assert (flags.drain_timeout_s, flags.health_probe_interval_s, flags.health_check_timeout_s) == (5, 0.5, 2)
    defaults = serve.config_from_args(parser.parse_args([]))
    assert (defaults.drain_timeout_s, defaults.health_probe_interval_s, defaults.health_check_timeout_s) == (30, 0.25, 0.75)
    path = tmp_path / "serve.toml"
    path.write_text("drain_timeout = 12\nhealth_check_timeout = 1.5\n\n[[models]]\nname = \"m\"\n")
    from_file = serve.config_from_args(parser.parse_args(["--config", str(path)]))
    assert (from_file.drain_timeout_s, from_file.health_check_timeout_s) == (12, 1.5)
