"""The router-wide health loop: every pool's ready and down workers, every interval, each within a short timeout.

A worker that is lost (its connection refused or reset) fails its check at once;
one that is hung (connection open, no answers) fails it when the timeout passes;
either way its pool marks it down and the calls on it fail over (``gateway.pools.pool``).
With the defaults (every 0.25 s, 0.75 s to answer) a dead or hung worker is out
within a second. A worker that answers again is back in rotation at the next round.
Workers a supervisor is restarting (``starting``) and those draining are skipped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from poolgate.gateway.pools.router import Router

log = logging.getLogger("poolgate.gateway.pools.health")


async def watch(router: Router, interval_s: float, timeout_s: float) -> None:
    """Forever: probe every pool of ``router`` (pools added later too), all at once, every ``interval_s``."""
    while True:
        pools = list(router.pools.values())
        await asyncio.gather(*(pool.probe(timeout_s) for pool in pools))
        await asyncio.sleep(interval_s)
