"""LogLimiter: a repeated line logs once, then once per window with the count of the repeats; keys bounded."""
from __future__ import annotations

import logging

from poolgate.shared.telemetry.log_limit import LogLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limiter(caplog, **kwargs) -> tuple[LogLimiter, Clock]:
    clock = Clock()
    caplog.set_level(logging.INFO, logger="test.log_limit")
    return LogLimiter(logging.getLogger("test.log_limit"), 10.0, clock=clock, **kwargs), clock


def test_repeats_log_once_then_a_count_per_window(caplog):
    limit, clock = limiter(caplog)
    for i in range(25_000):
        clock.now += 0.0001
        limit.log(logging.WARNING, ("worker-a", "gone"), "call %d failed: %s", i, "gone")
    assert [r.getMessage() for r in caplog.records] == ["call 0 failed: gone"]
    clock.now += 10
    limit.log(logging.WARNING, ("worker-a", "gone"), "call %d failed: %s", 25_000, "gone")
    assert caplog.records[-1].getMessage() == "call 25000 failed: gone (24999 more like it in the last 12s)"
    clock.now += 10.5
    limit.log(logging.WARNING, ("worker-a", "gone"), "call %d failed", 1)
    assert caplog.records[-1].getMessage() == "call 1 failed" and len(caplog.records) == 3  # no repeats between


def test_each_source_and_message_has_its_own_window(caplog):
    limit, _ = limiter(caplog)
    for key in [("a", "gone"), ("b", "gone"), ("a", "timeout"), ("a", "gone"), ("b", "gone")]:
        limit.log(logging.WARNING, key, "%s: %s", *key)
    assert [r.getMessage() for r in caplog.records] == ["a: gone", "b: gone", "a: timeout"]


def test_keys_are_bounded_and_a_disabled_level_counts_nothing(caplog):
    limit, _ = limiter(caplog, max_keys=3)
    for i in range(10):
        limit.log(logging.WARNING, i, "line %d", i)
    assert len(limit._seen) == 3 and len(caplog.records) == 10
    limit.log(logging.DEBUG, "quiet", "not shown")
    assert "quiet" not in limit._seen and len(caplog.records) == 10
