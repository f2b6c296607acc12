"""Graceful shutdown on SIGTERM/SIGINT: stop taking work, let the calls in flight finish (bounded), then stop.

On the first signal every pool drains: ``/health`` answers 503 (a load balancer
or Kubernetes stops sending traffic), new API requests get 503 with
``Retry-After`` (they are safe to send to another instance), and the calls
already sent to workers go on. Once none is left, or ``drain_timeout_s`` has
passed, ``stop`` runs (in the gateway: ``run_app``'s own graceful exit, which
waits for the responses being written, then stops the workers). A second
signal stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from poolgate.gateway.pools.router import Router

log = logging.getLogger("poolgate.gateway.pools.drain")


class Drain:
    """The drain of one gateway's ``router``; ``stop`` is called once, when it is over."""

    def __init__(self, router: Router, timeout_s: float, stop: Callable[[], None]) -> None:
        self.router, self.timeout_s, self.stop = router, timeout_s, stop
        self.task: asyncio.Task | None = None

    def install(self, loop: asyncio.AbstractEventLoop, also: Callable[[int], None] | None = None) -> None:
        """Take SIGTERM and SIGINT over (from aiohttp's immediate exit); ``also``: told each signal first (the
        parent of ``--gateway-processes`` passes it on to its siblings)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signalled, sig, also)

    def _signalled(self, sig: int, also: Callable[[int], None] | None) -> None:
        if also is not None:
            also(sig)
        self.begin(sig)

    def begin(self, sig: int | None = None) -> None:
        name = signal.Signals(sig).name if sig is not None else "shutdown"
        if self.task is not None:
            log.warning("%s again: stopping without waiting for the calls in flight", name)
            asyncio.get_running_loop().call_soon(self.stop)
            return
        pools = list(self.router.pools.values())
        busy = sum(pool.in_flight(c) for pool in pools for c in pool.clients)
        log.info("%s: draining (no new requests; waiting up to %gs for %d calls in flight)", name, self.timeout_s, busy)
        for pool in pools:
            pool.drain()
        self.task = asyncio.create_task(self._finish(pools))

    async def _finish(self, pools: list) -> None:
        try:
            await asyncio.wait_for(asyncio.gather(*(pool.idle() for pool in pools)), self.timeout_s)
            log.info("drained: no call in flight")
        except TimeoutError:
            left = sum(pool.in_flight(c) for pool in pools for c in pool.clients)
            log.warning("drain timeout (%gs): stopping with %d calls still in flight", self.timeout_s, left)
        asyncio.get_running_loop().call_soon(self.stop)
