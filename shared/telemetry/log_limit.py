"""Repeated log lines, limited: a message from one source logs once, then once per window with a count.

A failure that repeats per call (every request to a dead worker, every
malformed frame) would otherwise write a line per call: thousands a second.
``LogLimiter.log(level, key, msg, *args)`` logs the first line of a ``key``
(what failed and where: a status and message, a worker's address) at once;
repeats within ``every_s`` seconds are only counted, and the first repeat
after the window logs again with ``(N more like it in the last Ts)``. Keys
are bounded (the oldest forgotten first), so varying keys cannot grow memory.
Thread-safe (worker threads log too). Lines a person needs once (a worker
died, restarted, a pool is empty) are logged plainly, not through this.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

EVERY_S = 10.0
MAX_KEYS = 256


class LogLimiter:
    """One logger's lines, at most one per key per ``every_s`` seconds (counts of the rest in the next one)."""

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = EVERY_S,
        *,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.logger, self.every_s, self.max_keys, self.clock = logger, every_s, max_keys, clock
        self._seen: OrderedDict[Hashable, list[float]] = OrderedDict()  # key -> [window start, repeats counted]
        self._lock = threading.Lock()

    def check(self, key: Hashable) -> tuple[int, float] | None:
        """None: a repeat inside the window (counted, not logged); else (the repeats not logged, the seconds
        they span) and a new window starts."""
        with self._lock:
            now = self.clock()
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.every_s:
                seen[1] += 1
                return None
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_keys:
                self._seen.popitem(last=False)
            return (int(seen[1]), now - seen[0]) if seen is not None else (0, 0.0)

    def log(self, level: int, key: Hashable, msg: str, *args: object, **kwargs: Any) -> None:
        """``logger.log(level, msg, *args)`` unless ``key`` was logged less than ``every_s`` seconds ago."""
        if not self.logger.isEnabledFor(level):
            return
        seen = self.check(key)
        if seen is None:
            return
        repeats, span = seen
        if repeats:
            msg, args = f"{msg} (%d more like it in the last %.0fs)", (*args, repeats, span)
        self.logger.log(level, msg, *args, **kwargs)
