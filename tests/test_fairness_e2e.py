"""Starvation, priority and deadlines under load on a live `poolgate serve` of the bundled model (loopback).

The probing is ``gateway.bench.fairness``'s own: one client sends 1-input requests one after the other
(50 ms apart) beside heavy load and times them. The default run first measures the machine: a warm-up, then
the worker's capacity (its measured tokens/s, what admission reads) and the tokens an input counts; the load
is sized by them, so it holds the same seconds of work on every CPU (the pool's admission, ``QUEUED_S``, well
above it), and the bounds are relations measured in the same run, not seconds tuned on one CPU:

- priority 0 beside priority-10 bulk: 6 clients whose calls hold ``BULK_WORK_S`` of capacity together; the
  probes' p99 stays under half the bulk calls' own p50 (the test's docstring says why a broken scheduler
  fails it);
- ``X-Request-Timeout: 0.2`` beside load holding ``DEADLINE_LOAD_S`` of capacity: every call is answered 504
  ``deadline_exceeded`` or 200, a call as big as a load client's is cut (it cannot finish beside them), and
  none waits past ``DEADLINE_ANSWER_S`` (the deadline is the gateway's clock, not the worker's speed).

The issue's targets are absolute: p99 <= 1.5 s beside one 2,048-input request sent back to back, and beside
6 clients x 64 inputs at priority 10. On a fast, quiet machine they are benchmarks of it (on an AVX2 EPYC
running float32 a probe's p50 beside the bulk load was 1.6 s), so they are marked slow: 20 s of probing each,
or ``python -m poolgate.gateway.bench.fairness`` against any server.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from poolgate.gateway.bench import fairness
from poolgate.gateway.serving import TIMEOUT_HEADER
from poolgate.shared.domain.corpus import synthetic_corpus
from poolgate.shared.config.models import DEFAULT_MODEL_NAME
from tests.live_server import live_server

TARGET_P99_S = 1.5  # the target, both scenarios (slow: a benchmark of the machine)
BULK_CLIENTS = 6
BULK_WORK_S = 4.0  # seconds of measured capacity the bulk calls hold together
PROBES = 6
DEADLINE_LOAD_S = 2.0  # seconds of measured capacity the deadline test's load holds
DEADLINE_ANSWER_S = 1.0  # "answered within about a second" of a 0.2 s deadline
# The pool's admission (--max-queued-seconds): far above the load, which is sized by the rate measured at the
# start; on a shared machine the rate can halve mid-run, and at the default 5 s the bulk calls were then refused.
QUEUED_S = 15.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(url, tokens/s, tokens an input) of a warmed-up server."""
    with live_server(tmp_path_factory.mktemp("fairness"), "--max-queued-seconds", str(QUEUED_S)) as server:
        texts = synthetic_corpus(4096, seed=0)  # the bench's corpus
        per_input = server.warm_up([texts[i * 64:(i + 1) * 64] for i in range(2)])
        capacity = server.metrics_capacity()
        print(f"fairness: capacity {capacity:,.0f} tokens/s, {per_input:.1f} tokens an input")
        yield server.url, capacity, per_input
    assert server.proc.returncode == 0, f"exit {server.proc.returncode}\n{server.log_text()[-3000:]}"


def inputs_for(seconds: float, clients: int, capacity: float, per_input: float) -> int:
    """Inputs a call so that ``clients`` calls hold ``seconds`` of ``capacity`` together."""
    return max(1, min(2048, round(seconds * capacity / per_input / clients)))


def probe(url: str, scenario: str, duration_s: float, lead_s: float = 2.0, **sizes) -> dict:
    report = asyncio.run(fairness.run(url, DEFAULT_MODEL_NAME, scenario, duration_s=duration_s, lead_s=lead_s,
                                      **sizes))
    print(f"fairness {scenario} ({sizes or 'the issue sizes'}): {report}")
    assert report["probes"] >= 3 and report["probe_errors"] == 0, report  # no probe refused or failed
    assert report["heavy_inputs_per_s"] > 0 and report["heavy_errors"] == 0, report  # it ran as sized, all answered
    return report


@pytest.mark.slow
def test_small_requests_beside_a_2048_input_request_keep_p99_within_the_target(served):
    assert probe(served[0], "big", 20.0)["p99_s"] <= TARGET_P99_S


@pytest.mark.slow
def test_priority_0_under_priority_10_bulk_keeps_p99_within_the_target(served):
    assert probe(served[0], "bulk", 20.0)["p99_s"] <= TARGET_P99_S


def test_priority_0_requests_wait_far_less_than_the_bulk_calls_beside_them(served):
    """The fair policy runs priority 0 ahead of priority 10, in batches of ~0.25 s of device time, so a probe
    waits for about the batch running and the one prepared behind it, whatever the bulk queue holds; a bulk
    call waits for its share of all of it (about ``BULK_WORK_S``). A scheduler that lets priority 0 queue
    behind priority 10 (first in, first out: ``--batch-policy fifo``) makes a probe wait for the bulk calls
    queued before it: about a bulk call's own time. Measured with these sizes, the probes' p99 over the bulk
    calls' p50: fair 0.10 on an AMX Xeon in bf16 and 0.18 with oneDNN held to AVX2 in float32; fifo 0.92 and
    1.6. Half sits between: a broken scheduler's probes wait about as long as the bulk calls."""
    url, capacity, per_input = served
    bulk = inputs_for(BULK_WORK_S, BULK_CLIENTS, capacity, per_input)
    report = probe(url, "bulk", PROBES * BULK_WORK_S / 2, lead_s=1.0, bulk_clients=BULK_CLIENTS,
                   bulk_inputs=bulk, probes=PROBES)
    assert report["p99_s"] <= report["heavy_p50_s"] / 2, report


async def deadline_calls(url: str, n: int, load_inputs: int) -> list[tuple[int, float, int]]:
    """(status, seconds to the answer, inputs) of ``n`` calls with a 0.2 s deadline, sent one after the
    other while 6 clients keep the worker busy with ``load_inputs``-input requests at the same priority."""
    texts, stop, done = synthetic_corpus(7 * load_inputs + 1, seed=3), asyncio.Event(), [0]
    out = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        load = [asyncio.create_task(fairness._heavy(session, url, DEFAULT_MODEL_NAME,
                                                    texts[i * load_inputs:(i + 1) * load_inputs], 0, stop, done))
                for i in range(6)]
        await asyncio.sleep(1.0)
        for i in range(n):
            inputs = texts[-load_inputs:] if i % 2 else texts[-1:]  # a 1-input call and a load-sized one in turn
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


def test_a_0_2s_deadline_under_load_is_answered_within_about_a_second(served):
    url, capacity, per_input = served
    load_inputs = inputs_for(DEADLINE_LOAD_S, 6, capacity, per_input)
    calls = asyncio.run(deadline_calls(url, 10, load_inputs))
    print(f"deadline 0.2s beside 6 x {load_inputs} inputs: {[(s, round(t, 3), n) for s, t, n in calls]}")
    assert all(status in (200, 504) for status, _, _ in calls), calls
    cut = [status for status, _, n in calls if n == load_inputs]  # 7 x its work queued: it cannot finish in 0.2 s
    assert cut and all(status == 504 for status in cut), calls
    assert max(t for _, t, _ in calls) <= DEADLINE_ANSWER_S, calls
