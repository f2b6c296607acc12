"""The worker's memory bounds: oneDNN's primitive cache unless the environment says otherwise, glibc trimming."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from poolgate.shared.config.cpu import cpu_class
from poolgate.shared.config.models import bundled_model_path
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
import sys
from poolgate.workers import memory
memory.bound_malloc(memory._glibc())
from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.corpus import synthetic_corpus
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.build import load_model
from poolgate.workers.tools.bench_arch import batches
model = load_model(WorkerConfig(model=bundled_model_path(), served_model_name="m", dtype=sys.argv[1]))
ids = model.encoder.encode(synthetic_corpus(512, 0), max_tokens=model.info.max_model_len)
params = PoolingParams(task=model.info.tasks[0])
work = [model.runner.prepare([Sequence(s, params) for s in b]) for b in batches(ids, 8192)]
for p in work:
    model.runner.execute(p)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for p in work:
    model.runner.execute(p)
print(model.info.dtype, len(work), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _unset_malloc(environ) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")}


def _faults_per_batch(dtype: str, env: dict[str, str]) -> tuple[str, float]:
    """(the dtype it ran, page faults a batch) of the bundled model's forward with the bounds, in a process of
    its own: every batch once, then each again, counted (the heap has grown to the biggest by then)."""
    out = subprocess.run([sys.executable, "-c", FORWARD, dtype], capture_output=True, text=True,
                         timeout=300, env={**_unset_malloc(os.environ), **env})
    assert out.returncode == 0, out.stderr[-3000:]
    ran, batches, faults = out.stdout.split()[-3:]
    return ran, int(faults) / int(batches)


NO_AMX = {"POOLGATE_CPU_ATTENTION": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
CAPS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")  # a cap the environment chose (CI's smaller CPU class)


def _no_amx_case() -> tuple[str, dict[str, str]]:
    """bf16 with oneDNN and the attention kernel held off AMX, as on a CPU with AVX512-BF16 and no AMX (CI's
    EPYC): only where this CPU shows AMX (``POOLGATE_CPU_CLASS`` may hide it) and no cap of the environment's
    would be lifted by the case's own."""
    if cpu_class().name != "amx":
        pytest.skip(f"this CPU runs as class {cpu_class().name}: 'as found' already runs without AMX")
    capped = [k for k in CAPS if k in os.environ]
    if capped:
        pytest.skip(f"the environment caps the CPU ({', '.join(capped)}): 'as found' runs as it says")
    return "bfloat16", NO_AMX


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("case", ["as found", "no AMX"])
def test_a_forwards_tensors_reuse_the_heap_instead_of_faulting_in_new_pages(case):
    """The bundled model's forward on batches of 8,192 tokens (the CPU budget), in a process of its own, the trimming
    thread left out: with the bounds the activations reuse the heap, so once every batch ran, running them again
    faults in fewer than a third of the pages one layer's QKV tensor holds in the dtype that ran (bf16: 1,536 pages;
    fp32: 3,072). As found is the dtype the worker picks on this CPU (``--dtype auto``: bf16 where it has BF16, fp32
    on an AVX2 CPU); no AMX is bf16 with oneDNN and the attention kernel held off AMX. Counted on the second pass,
    so the count does not hang on the CPU: the first pass grows the heap to the biggest batch (one fp32 batch on
    AVX2 faulted 12,800 pages doing so), which is not reuse. Measured here (AMX Xeon; fp32 as an AVX2 CPU), in runs
    beside other work: 10 a batch bf16 as found, 11-395 no AMX, 17-529 fp32. Each bound matters: with the arena cap
    alone (glibc's thresholds left to move) a free that left a big heap top handed it back and the next tensors
    faulted it in again (bf16: ~11,000 a batch); with no bound at all, bf16 9,000-17,800 and fp32 39,000; with two
    arenas the threads' heaps are unmapped and mapped again as they empty (250-5,600 a batch here run to run, as
    found or off AMX; 8,355 on CI's EPYC counted on a first pass)."""
    dtype, env = ("auto", {}) if case == "as found" else _no_amx_case()
    hidden = json.loads((Path(bundled_model_path()) / "config.json").read_text())["hidden_size"]
    ran, bounded = _faults_per_batch(dtype, env)
    qkv_pages = 8192 * 3 * hidden * BYTES[ran] // os.sysconf("SC_PAGE_SIZE")
    print(f"page faults a batch ({case}, {ran}): {bounded:.0f}, bound {qkv_pages / 3:.0f}")
    assert bounded < qkv_pages / 3, (ran, bounded, qkv_pages)


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
