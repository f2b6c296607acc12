"""The worker's drain on SIGTERM: wait while calls are queued or running, up to a bound."""
from __future__ import annotations

import time

from poolgate.workers.main import drain


class Busy:
    """An engine stand-in whose load reports ``left`` calls running, one fewer per look."""

    def __init__(self, left: int):
        self.left = left

    def load(self) -> dict:
        self.left = max(self.left - 1, 0) if self.left != -1 else -1
        running = 1 if self.left else 0
        return {"queued": 0, "requests_waiting": 0, "requests_running": running}


async def test_drain_returns_once_nothing_is_in_flight():
    started = time.monotonic()
    await drain(Busy(3), timeout_s=5)
    assert time.monotonic() - started < 1


async def test_drain_is_bounded(caplog):
    started = time.monotonic()
    await drain(Busy(-1), timeout_s=0.2)  # never idle
    assert 0.2 <= time.monotonic() - started < 1
    assert "still in flight after draining" in caplog.text
