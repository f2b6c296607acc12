"""A bounded soak: steady load on a running server while the resident memory of it and its workers is sampled.

``python -m poolgate.gateway.bench.soak --url URL --pid GATEWAY_PID --duration 180``

``--clients`` (4) clients send ``--inputs`` (16)-input ``/v1/embeddings``
requests back to back, each input cut to a random length so batches have
ever-different token counts (the load that grew a worker from 0.48 to 1.85 GB).
Every ``--every`` seconds it prints the gateway's and each child process's
resident memory (``/proc``, Linux) as a JSON line; at the end, a summary:
first and last samples, and the growth over the second half of the run (what
"flat after warm-up" means here). A client only: it imports no worker code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import aiohttp

from poolgate.shared.domain.corpus import synthetic_corpus


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def sample(pid: int) -> dict[str, float | None]:
    return {"gateway": rss_mb(pid), **{f"worker {c}": rss_mb(c) for c in children(pid)}}


async def _client(
    session: aiohttp.ClientSession, url: str, model: str, texts: list[str], inputs: int, stop: float, seed: int
) -> int:
    rng, done = random.Random(seed), 0
    while time.monotonic() < stop:
        batch = [t[: rng.randint(10, len(t))] for t in rng.sample(texts, inputs)]
        body = {"model": model, "input": batch, "truncate_prompt_tokens": -1, "encoding_format": "base64"}
        async with session.post(f"{url}/v1/embeddings", json=body) as resp:
            await resp.read()
            done += resp.status == 200
    return done


async def run(
    url: str,
    model: str,
    pid: int,
    *,
    duration_s: float = 180.0,
    every_s: float = 15.0,
    clients: int = 4,
    inputs: int = 16,
) -> dict:
    """The soak (module doc); returns the samples and the summary."""
    texts, stop = synthetic_corpus(4096, seed=1), time.monotonic() + duration_s
    samples: list[dict[str, Any]] = []
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:
        load = [
            asyncio.create_task(_client(session, url.rstrip("/"), model, texts, inputs, stop, i))
            for i in range(clients)
        ]
        while time.monotonic() < stop:
            samples.append({"t_s": round(time.monotonic() - start), **sample(pid)})
            print(json.dumps(samples[-1]), flush=True)
            await asyncio.sleep(min(every_s, max(0.0, stop - time.monotonic())))
        answered = sum(await asyncio.gather(*load))
    samples.append({"t_s": round(time.monotonic() - start), **sample(pid)})
    half = [s for s in samples if s["t_s"] >= duration_s / 2]
    growth = {k: max(s[k] or 0 for s in half) - (half[0][k] or 0) for k in half[0] if k != "t_s"}
    return {
        "samples": samples,
        "answered": answered,
        "first": samples[0],
        "last": samples[-1],
        "second_half_growth_mb": growth,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--pid", type=int, required=True, help="the gateway's pid (its workers are its children)")
    p.add_argument("--duration", type=float, default=180.0)
    p.add_argument("--every", type=float, default=15.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--inputs", type=int, default=16)
    a = p.parse_args(argv)
    report = asyncio.run(
        run(a.url, a.model, a.pid, duration_s=a.duration, every_s=a.every, clients=a.clients, inputs=a.inputs)
    )
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}))


if __name__ == "__main__":
    main()
