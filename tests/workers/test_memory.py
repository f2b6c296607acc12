"""The worker's memory bounds: oneDNN's primitive cache unless the environment says otherwise, glibc trimming."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from poolgate.shared.models import bundled_model_path
from poolgate.workers import memory


def test_the_primitive_cache_is_bounded_unless_the_environment_chose(monkeypatch):
    monkeypatch.setattr(memory, "_glibc", lambda: None)
    env: dict[str, str] = {}
    assert memory.bound_memory(env) is None
    assert env == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(memory.PRIMITIVE_CACHE)}
    chosen = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "256"}
    memory.bound_memory(chosen)
    assert chosen["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "256"


class RecordingLibc:
    """glibc's mallopt and malloc_trim, recorded; mallopt refuses the parameters in ``refuse``."""

    def __init__(self, refuse: tuple[int, ...] = ()):
        self.calls: list[tuple] = []
        self.refuse = refuse

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return 0 if param in self.refuse else 1

    def malloc_trim(self, pad):
        self.calls.append(("trim", pad))
        return 1

    def params(self) -> list[int]:
        return [c[1] for c in self.calls if c[0] == "mallopt"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and malloc_trim")
def test_on_glibc_the_arenas_are_capped_and_a_daemon_thread_trims(monkeypatch):
    libc = RecordingLibc()
    calls = libc.calls
    monkeypatch.setattr(memory, "_glibc", lambda: libc)
    monkeypatch.setattr(memory, "TRIM_EVERY_S", 0.01)
    stop = memory.bound_memory({})
    try:
        for _ in range(200):
            if ("trim", 0) in calls:
                break
            stop.wait(0.01)
        assert calls[:3] == [("mallopt", memory.M_ARENA_MAX, memory.ARENAS),
                             ("mallopt", memory.M_MMAP_THRESHOLD, memory.MMAP_THRESHOLD),
                             ("mallopt", memory.M_TRIM_THRESHOLD, memory.TRIM_THRESHOLD)]
        assert ("trim", 0) in calls
    finally:
        stop.set()
    assert memory._glibc() is not None  # the real libc is found on this platform


FORWARD = """
import resource
from poolgate.workers import memory
memory.bound_malloc(memory._glibc())
from poolgate.shared.config import WorkerConfig
from poolgate.shared.corpus import synthetic_corpus
from poolgate.shared.models import bundled_model_path
from poolgate.shared.params import PoolingParams
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.build import load_model
from poolgate.workers.tools.bench_arch import batches
model = load_model(WorkerConfig(model_path=bundled_model_path(), served_model_name="m", dtype="bfloat16"))
ids = model.encoder.encode(synthetic_corpus(1024, 0), max_tokens=model.info.max_model_len)
params = PoolingParams(task=model.info.tasks[0])
work = [model.runner.prepare([Sequence(s, params) for s in b]) for b in batches(ids, 8192)]
model.runner.execute(work[0])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for p in work[1:]:
    model.runner.execute(p)
print(len(work) - 1, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _unset_malloc(environ) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}


def _faults_per_batch(env: dict[str, str]) -> float:
    """Page faults a batch of the bundled model's forward with the bounds, in a process of its own."""
    out = subprocess.run([sys.executable, "-c", FORWARD], capture_output=True, text=True,
                         check=True, timeout=300, env={**_unset_malloc(os.environ), **env})
    batches, faults = map(int, out.stdout.split()[-2:])
    return faults / batches


NO_AMX = {"POOLGATE_CPU_ATTENTION": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("env", [{}, NO_AMX], ids=["as found", "no AMX"])
def test_a_forwards_tensors_reuse_the_heap_instead_of_faulting_in_new_pages(env):
    """The bundled model's forward on batches of 8,192 tokens (the CPU budget), in a process of its own, the
    trimming thread left out: with the bounds the activations reuse the heap, so a batch faults in fewer than
    a third of the pages one layer's QKV tensor holds (measured here: 143-760 a batch, 1,536 allowed), as
    found and with oneDNN and the attention kernel held off AMX, as on CI's EPYC. Each bound matters: with
    the arena cap alone (glibc's thresholds left to move) a free that left a big heap top handed it back and
    the next tensors faulted it in again (7,100-23,000 a batch); with two arenas, off AMX, the other
    threads' heaps were unmapped and mapped again each batch (3,800 here, 8,355 on CI)."""
    hidden = json.loads((Path(bundled_model_path()) / "config.json").read_text())["hidden_size"]
    qkv_pages = 8192 * 3 * hidden * 2 // os.sysconf("SC_PAGE_SIZE")
    bounded = _faults_per_batch(env)
    assert bounded < qkv_pages / 3, (bounded, qkv_pages)


def test_a_value_glibc_refuses_is_logged_and_the_rest_still_applied(caplog):
    libc = RecordingLibc(refuse=(memory.M_MMAP_THRESHOLD,))
    with caplog.at_level("WARNING", logger="poolgate.worker.memory"):
        memory.bound_malloc(libc, {})
    assert libc.params() == [memory.M_ARENA_MAX, memory.M_MMAP_THRESHOLD, memory.M_TRIM_THRESHOLD]
    assert [r.getMessage() for r in caplog.records] == [
        f"glibc refused mallopt({memory.M_MMAP_THRESHOLD}, {memory.MMAP_THRESHOLD}); its default stays"]


def test_a_bound_the_environment_chose_is_left_to_it():
    libc = RecordingLibc()
    memory.bound_malloc(libc, {"MALLOC_ARENA_MAX": "8"})
    assert libc.params() == [memory.M_MMAP_THRESHOLD, memory.M_TRIM_THRESHOLD]
    libc = RecordingLibc()
    memory.bound_malloc(libc, {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=4096"})
    assert libc.params() == [memory.M_ARENA_MAX, memory.M_MMAP_THRESHOLD]
