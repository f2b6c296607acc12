"""Starvation, priority and deadlines under load on a live `poolgate serve` of the bundled model (loopback).

The probing is ``gateway.bench.fairness``'s own: one client sends 1-input requests one after the other
(50 ms apart) beside heavy load and times them.

- beside one 2,048-input request sent back to back (``big``), the 1-input requests' p99 <= 1.5 s;
- beside 6 clients x 64 inputs at priority 10 without pause (``bulk``), priority-0 requests' p99 <= 1.5 s.

Those are the issue's targets, timing checks on a machine that must be quiet to mean anything, so they
are marked slow (20 s of probing each). The default run has a short ``bulk`` one with a loose bound
(``LOOSE_P99_S``: it catches a stalled or starved probe, not the target, which priority ignored missed
by only 2x: 2.9 s; a short ``big`` one would cost ~11 s more, as its last 2,048-input request must be
answered before the run ends), and the deadline check: ``X-Request-Timeout: 0.2`` on a loaded server is
answered (504 or 200) within ``DEADLINE_ANSWER_S``.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from poolgate.gateway.bench import fairness
from poolgate.gateway.serving import TIMEOUT_HEADER
from poolgate.shared.corpus import synthetic_corpus
from poolgate.shared.models import DEFAULT_MODEL_NAME
from tests.live_server import live_server

TARGET_P99_S = 1.5  # the target, both scenarios
LOOSE_P99_S = 5.0
DEADLINE_ANSWER_S = 1.0  # "answered within about a second" of a 0.2 s deadline


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with live_server(tmp_path_factory.mktemp("fairness")) as server:
        yield server.url
    assert server.proc.returncode == 0, f"exit {server.proc.returncode}\n{server.log_text()[-3000:]}"


def probe(url: str, scenario: str, duration_s: float, lead_s: float = 2.0) -> dict:
    report = asyncio.run(fairness.run(url, DEFAULT_MODEL_NAME, scenario, duration_s=duration_s, lead_s=lead_s))
    print(f"fairness {scenario} ({duration_s:.0f}s of probing): {report}")
    assert report["probes"] >= 3 and report["probe_errors"] == 0, report  # no probe refused or failed
    return report


@pytest.mark.slow
def test_small_requests_beside_a_2048_input_request_keep_p99_within_the_target(url):
    report = probe(url, "big", 20.0)
    assert report["heavy_inputs_per_s"] > 0, report  # the big request did run (and was answered)
    assert report["p99_s"] <= TARGET_P99_S, report


@pytest.mark.slow
def test_priority_0_under_priority_10_bulk_keeps_p99_within_the_target(url):
    report = probe(url, "bulk", 20.0)
    assert report["heavy_inputs_per_s"] > 0, report
    assert report["p99_s"] <= TARGET_P99_S, report


def test_priority_0_requests_are_not_starved_by_bulk_load(url):
    assert probe(url, "bulk", 3.0, lead_s=1.0)["p99_s"] <= LOOSE_P99_S


async def deadline_calls(url: str, n: int) -> list[tuple[int, float, int]]:
    """(status, seconds to the answer, inputs) of ``n`` calls with a 0.2 s deadline, sent one after the
    other while 6 clients keep the worker busy with 64-input requests at the same priority."""
    texts, stop, done = synthetic_corpus(1024, seed=3), asyncio.Event(), [0]
    out = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        load = [asyncio.create_task(fairness._heavy(session, url, DEFAULT_MODEL_NAME, texts[i * 64:(i + 1) * 64],
                                                    0, stop, done)) for i in range(6)]
        await asyncio.sleep(2.0)
        for i in range(n):
            inputs = texts[-64:] if i % 2 else texts[-1:]  # a 1-input call and a 64-input one in turn
            body = {"model": DEFAULT_MODEL_NAME, "input": inputs, "encoding_format": "base64",
                    "truncate_prompt_tokens": -1}
            start = time.perf_counter()
            async with session.post(f"{url}/v1/embeddings", json=body, headers={TIMEOUT_HEADER: "0.2"}) as resp:
                payload = await resp.json()
                out.append((resp.status, time.perf_counter() - start, len(inputs)))
            if resp.status == 504:
                assert payload["error"]["code"] == "deadline_exceeded", payload
        stop.set()
        await asyncio.gather(*load, return_exceptions=True)
    assert done[0] > 0  # the load was answered too
    return out


def test_a_0_2s_deadline_under_load_is_answered_within_about_a_second(url):
    calls = asyncio.run(deadline_calls(url, 10))
    print(f"deadline 0.2s under load: {[(s, round(t, 3), n) for s, t, n in calls]}")
    assert all(status in (200, 504) for status, _, _ in calls), calls
    assert any(status == 504 for status, _, _ in calls), calls  # some could not finish in time: the deadline cut
    assert max(t for _, t, _ in calls) <= DEADLINE_ANSWER_S, calls
