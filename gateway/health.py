"""Active health checks: every pool's ready and down workers, every interval, each within a short timeout.

A worker that is lost (its connection refused or reset) fails its check at once;
one that is hung (connection open, no answers) fails it when the timeout passes;
either way its pool marks it down and the calls on it fail over (``gateway.pool``).
With the defaults (every 0.25 s, 0.75 s to answer) a dead or hung worker is out
within a second. A worker that answers again is back in rotation at the next round.
Workers a supervisor is restarting (``starting``) and those draining are skipped.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from poolgate.shared.errors import Unavailable

if TYPE_CHECKING:
    from poolgate.gateway.router import Router

log = logging.getLogger("poolgate.gateway.health")


async def check(client, timeout_s: float | None) -> str | None:
    """None when ``client`` answers its health check in time and says it is ready, else why not."""
    try:
        answer = await asyncio.wait_for(client.health(), timeout_s)
    except asyncio.TimeoutError:
        return f"no health answer within {timeout_s}s"
    except Unavailable as exc:
        return str(exc)
    except Exception as exc:  # an error answer from the worker counts as not healthy
        return f"health check failed: {exc}"
    if isinstance(answer, dict) and answer.get("ready") is False:
        return "the worker says it is not ready" + (" (draining)" if answer.get("draining") else "")
    return None


async def watch(router: Router, interval_s: float, timeout_s: float) -> None:
    """Forever: probe every pool of ``router`` (pools added later too), all at once, every ``interval_s``."""
    while True:
        pools = list(router.pools.values())
        await asyncio.gather(*(pool.probe(timeout_s) for pool in pools))
        await asyncio.sleep(interval_s)
