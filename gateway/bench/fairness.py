"""Latency of small interactive requests beside heavy work: the fairness and priority check.

``python -m poolgate.gateway.bench.fairness --url URL --scenario big|bulk --duration S``

- ``big``: one client sends requests of ``--big-inputs`` (2,048) inputs back
  to back; a probe sends 1-input requests one after the other and reports
  their latency (the issue's "small request beside a 2,048-input request");
- ``bulk``: ``--bulk-clients`` (6) clients send ``--bulk-inputs`` (64)-input
  requests at ``priority`` 10 without pause; the probe's 1-input requests run
  at priority 0.

The run is bounded by ``--duration`` (seconds of probing), or ends sooner
after ``--probes`` answered probes; the heavy load starts ``--lead`` seconds
earlier so the queue is full when probing begins. Prints (and returns) the
probe's count, p50, p99 and max in seconds, the heavy load's inputs per second,
its calls answered and not (``heavy_errors``), and the answered ones' p50
(``heavy_p50_s``: the scale a fair scheduler keeps the probe well below, and a
first-in-first-out one does not). A client only: it imports no worker code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import numpy as np

from poolgate.shared.domain.corpus import synthetic_corpus


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> int:
    async with session.post(f"{url}/v1/embeddings", json=body) as resp:
        await resp.read()
        return resp.status


async def _heavy(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    inputs: list[str],
    priority: int,
    stop: asyncio.Event,
    done: list[int],
    calls: list[tuple[int, float]] | None = None,
) -> None:
    """Send ``inputs`` in one call after the other until ``stop``; count the answered inputs in ``done`` and
    each call's (status, seconds) in ``calls``."""
    while not stop.is_set():
        body = {
            "model": model,
            "input": inputs,
            "encoding_format": "base64",
            "priority": priority,
            "truncate_prompt_tokens": -1,
        }
        start = time.perf_counter()
        status = await _post(session, url, body)
        if status == 200:
            done[0] += len(inputs)
        if calls is not None:
            calls.append((status, time.perf_counter() - start))


async def _probe(
    session: aiohttp.ClientSession, url: str, model: str, texts: list[str], duration_s: float, probes: int | None = None
) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors, end, i = 0, time.monotonic() + duration_s, 0
    while time.monotonic() < end and (probes is None or len(latencies) < probes):
        body = {
            "model": model,
            "input": [texts[i % len(texts)]],
            "encoding_format": "base64",
            "priority": 0,
            "truncate_prompt_tokens": -1,
        }
        start = time.perf_counter()
        status = await _post(session, url, body)
        if status == 200:
            latencies.append(time.perf_counter() - start)
        else:
            errors += 1
        i += 1
        await asyncio.sleep(0.05)
    return latencies, errors


async def run(
    url: str,
    model: str,
    scenario: str,
    *,
    duration_s: float = 20.0,
    lead_s: float = 2.0,
    big_inputs: int = 2048,
    bulk_clients: int = 6,
    bulk_inputs: int = 64,
    probes: int | None = None,
) -> dict:
    """One bounded run of ``scenario`` (module doc); the probe's latency figures."""
    texts = synthetic_corpus(4096, seed=0)
    url = url.rstrip("/")
    heavy = (
        [(texts[:big_inputs], 0)]
        if scenario == "big"
        else [(texts[i * bulk_inputs : (i + 1) * bulk_inputs], 10) for i in range(bulk_clients)]
    )
    stop, done = asyncio.Event(), [0]
    calls: list[tuple[int, float]] = []
    timeout = aiohttp.ClientTimeout(total=duration_s + lead_s + 120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        load = [
            asyncio.create_task(_heavy(session, url, model, inputs, prio, stop, done, calls)) for inputs, prio in heavy
        ]
        await asyncio.sleep(lead_s)
        started = time.monotonic()
        latencies, errors = await _probe(session, url, model, texts[-256:], duration_s, probes)
        probing_s = time.monotonic() - started
        stop.set()
        await asyncio.gather(*load, return_exceptions=True)
    lat = np.array(latencies or [float("nan")])
    heavy_s = [seconds for status, seconds in calls if status == 200]
    return {
        "scenario": scenario,
        "probes": len(latencies),
        "probe_errors": errors,
        "p50_s": float(np.percentile(lat, 50)),
        "p99_s": float(np.percentile(lat, 99)),
        "max_s": float(lat.max()),
        "heavy_inputs_per_s": done[0] / probing_s if probing_s else 0.0,
        "heavy_calls": len(heavy_s),
        "heavy_errors": len(calls) - len(heavy_s),
        "heavy_p50_s": float(np.percentile(heavy_s, 50)) if heavy_s else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--scenario", choices=("big", "bulk"), required=True)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--lead", type=float, default=2.0)
    p.add_argument("--big-inputs", type=int, default=2048)
    p.add_argument("--bulk-clients", type=int, default=6)
    p.add_argument("--bulk-inputs", type=int, default=64)
    p.add_argument("--probes", type=int, default=None, help="end the probing after this many answered probes")
    a = p.parse_args(argv)
    print(
        json.dumps(
            asyncio.run(
                run(
                    a.url,
                    a.model,
                    a.scenario,
                    duration_s=a.duration,
                    lead_s=a.lead,
                    big_inputs=a.big_inputs,
                    bulk_clients=a.bulk_clients,
                    bulk_inputs=a.bulk_inputs,
                    probes=a.probes,
                )
            )
        )
    )


if __name__ == "__main__":
    main()
