"""The worker's memory bounds: oneDNN's primitive cache unless the environment says otherwise, glibc trimming."""
from __future__ import annotations

import sys

import pytest

from poolgate.workers import memory


def test_the_primitive_cache_is_bounded_unless_the_environment_chose(monkeypatch):
    monkeypatch.setattr(memory, "_glibc", lambda: None)
    env: dict[str, str] = {}
    assert memory.bound_memory(env) is None
    assert env == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(memory.PRIMITIVE_CACHE)}
    chosen = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256"}
    memory.bound_memory(chosen)
    assert chosen["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "256"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and malloc_trim")
def test_on_glibc_the_arenas_are_capped_and_a_daemon_thread_trims(monkeypatch):
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append(("mallopt", param, value))
            return 1

        def malloc_trim(self, pad):
            calls.append(("trim", pad))
            return 1

    monkeypatch.setattr(memory, "_glibc", Libc)
    monkeypatch.setattr(memory, "TRIM_EVERY_S", 0.01)
    stop = memory.bound_memory({})
    try:
        for _ in range(200):
            if ("trim", 0) in calls:
                break
            stop.wait(0.01)
        assert calls[0] == ("mallopt", memory.M_ARENA_MAX, memory.ARENAS) and ("trim", 0) in calls
    finally:
        stop.set()
    assert memory._glibc() is not None  # the real libc is found on this platform
