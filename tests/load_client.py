"""An open-loop HTTP load client for the load tests: requests sent on a schedule, whatever the answers.

A closed loop (send, wait, send) slows down with the server and never
overloads it; here request ``i`` leaves at ``i / rate`` seconds whether or not
the earlier ones were answered, as independent clients would send them.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Callable

import aiohttp

_serial = itertools.count()


@dataclass
class Outcome:
    """One request's fate."""

    sent_at: float  # seconds since the load started
    latency_s: float
    status: int | None  # None: no HTTP answer (connection reset, timeout)
    retry_after: str | None
    body: object  # the parsed JSON body, or the exception's text
    tag: str = ""


def texts(n: int, words: int = 12) -> list[str]:
    """``n`` distinct inputs of about ``words`` words (a serial number in each, so no cache can answer them)."""
    return [f"request {next(_serial)} says " + " ".join(f"word{(i * 7 + k) % 97}" for k in range(words))
            for i in range(n)]


async def _one(session: aiohttp.ClientSession, url: str, body: dict, headers: dict, start: float,
               tag: str, timeout_s: float) -> Outcome:
    sent = time.monotonic()
    try:
        async with session.post(url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            data = await r.json(content_type=None)
            return Outcome(sent - start, time.monotonic() - sent, r.status, r.headers.get("Retry-After"), data, tag)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as err:
        return Outcome(sent - start, time.monotonic() - sent, None, None, repr(err), tag)


async def open_loop(url: str, rate_per_s: float, duration_s: float, body: Callable[[], dict], *,
                    headers: dict | None = None, tag: str = "", timeout_s: float = 120,
                    during: Callable[[float], None] | None = None) -> list[Outcome]:
    """POST ``body()`` to ``url`` at ``rate_per_s`` for ``duration_s``; every outcome once all are answered.
    ``during(t)`` is called before each send (``t``: seconds since the start), e.g. to kill a worker."""
    n = max(1, round(rate_per_s * duration_s))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.monotonic()
        tasks = []
        for i in range(n):
            delay = start + i / rate_per_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if during is not None:
                during(time.monotonic() - start)
            tasks.append(asyncio.create_task(_one(session, url, body(), headers or {}, start, tag, timeout_s)))
        return list(await asyncio.gather(*tasks))


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] if ordered else float("nan")
