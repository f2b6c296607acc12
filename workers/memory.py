"""Keep the worker's resident memory flat under steady load: oneDNN's primitive cache and glibc's allocator.

Every batch has its own token count, so on CPU every batch is a new matmul
shape: oneDNN keeps a compiled primitive per shape (up to 1,024 by default),
and glibc's allocator, with one arena per thread and a mmap threshold that
grows after big frees, keeps the freed blocks of every size it has seen. A
22M-parameter model's worker grew from ~480 MB to ~1.85 GB in 2.5 minutes of
4 clients × 16 inputs. ``bound_memory`` (called at the worker's edge, before
torch loads) bounds both:

- ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` = ``PRIMITIVE_CACHE`` (64) unless the
  environment sets it: enough for the shapes one batch repeats (8 halved the
  throughput: every batch recompiled its primitives), far below 1,024;
- one malloc arena (``ARENAS``, ``mallopt(M_ARENA_MAX)``) for every thread;
- a daemon thread gives freed memory back to the kernel every
  ``TRIM_EVERY_S`` seconds (``malloc_trim(0)``), off the batches' path;
- and only that thread: a free no longer trims the heap's top itself
  (``M_TRIM_THRESHOLD`` = ``TRIM_THRESHOLD``), and blocks up to
  ``MMAP_THRESHOLD`` (32 MiB, glibc's largest) always come from the heap, not
  a mmap of their own. A forward allocates and frees tens of MB a layer
  (8,192 tokens of MiniLM: QKV 18.9 MB, the FFN's 25 MB); with glibc's
  defaults each free that left more than twice the last mmapped size at the
  heap's top handed it back, so the next layer's tensors were new pages: a
  page fault and the kernel zeroing each 4 KiB. Kept between batches: the
  bundled model's forward on 8,192-token batches faults ~430 pages a batch
  instead of ~11,000. One arena, not two: a thread other than the main one
  (torch's intra-op pool, the attention kernel's team) allocates from a second
  arena, whose heaps are mmapped 64 MiB regions that glibc unmaps as soon as
  one is wholly free, trim threshold or not. Where oneDNN has no AMX the
  threads' buffers did that every batch: the same forward, oneDNN held to
  AVX512-BF16 and the kernel to its AVX512 build, faulted ~3,800 pages a batch
  with two arenas and ~415 with one (CI's EPYC, with two: 8,355, more than the
  arena cap alone gave it). Throughput was the same either way (``poolgate
  bench-runner``, 2,048 texts, alternating: 47.2k and 43.6k tokens/s with two,
  48.3k and 53.4k with one). With two arenas, the worker under ``poolgate
  bench`` (4,096 texts) faulted 67-98 thousand pages instead of 482-645
  thousand and answered 41.7k and 44.1k tokens/s where the same commit without
  the thresholds answered 40.8k and 40.2k (alternating, one sitting), resident
  415 MB instead of 402; with one, 70 and 90 thousand where the commit before
  them all faulted 676 and 135 thousand (one sitting). The trimming thread
  still bounds what stays: the soak's second half grew 10 MB.

Measured with the bundled model under that load for 2.5 minutes
(``gateway.bench.soak``): 1.08–1.20 GB from the second minute on, where it was
1.85 GB and still climbing.

An operator's own setting of any of the three (``MALLOC_ARENA_MAX``,
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or their
``GLIBC_TUNABLES`` names) is kept: on a many-core host whose tokenizer threads
allocate in parallel, more arenas may be worth their faults (not measured here:
two cores).
Off glibc (musl, macOS) only the cache bound applies.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from typing import Mapping, MutableMapping

log = logging.getLogger("poolgate.worker.memory")

PRIMITIVE_CACHE = 64
ARENAS = 1  # every thread on the main arena, whose heap only the trimming thread shrinks
TRIM_EVERY_S = 5.0
MMAP_THRESHOLD = 32 << 20  # glibc's upper limit for M_MMAP_THRESHOLD on 64-bit
TRIM_THRESHOLD = 1 << 30  # above any heap top one batch leaves: trimming is the thread's alone
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameter numbers


def bound_memory(environ: MutableMapping[str, str] = os.environ) -> threading.Event | None:
    """Apply the bounds (module doc); returns the event that stops the trimming thread (None off glibc)."""
    environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(PRIMITIVE_CACHE))
    libc = _glibc()
    if libc is None:
        return None
    bound_malloc(libc, environ)
    stop = threading.Event()
    threading.Thread(target=_trim_forever, args=(libc, stop), name="poolgate-trim", daemon=True).start()
    return stop


# Each bound with the environment variable and the glibc tunable an operator would set it by: one that is set wins
# (glibc has applied it at start-up), as ONEDNN_PRIMITIVE_CACHE_CAPACITY does.
MALLOC_BOUNDS = ((M_ARENA_MAX, ARENAS, "MALLOC_ARENA_MAX", "glibc.malloc.arena_max"),
                 (M_MMAP_THRESHOLD, MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
                 (M_TRIM_THRESHOLD, TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"))


def bound_malloc(libc, environ: Mapping[str, str] = os.environ) -> None:
    """The arena cap and the fixed thresholds (module doc), each unless the environment chose it (a
    ``MALLOC_*`` variable or a ``GLIBC_TUNABLES`` entry); a value glibc refuses is logged, not fatal."""
    tunables = {item.split("=", 1)[0] for item in environ.get("GLIBC_TUNABLES", "").split(":")}
    for param, value, variable, tunable in MALLOC_BOUNDS:
        if variable in environ or tunable in tunables:
            continue
        if libc.mallopt(param, value) != 1:
            log.warning("glibc refused mallopt(%d, %d); its default stays", param, value)


def _glibc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes, libc.mallopt.argtypes = [ctypes.c_size_t], [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError, TypeError):
        return None


def _trim_forever(libc, stop: threading.Event) -> None:
    while not stop.wait(TRIM_EVERY_S):
        libc.malloc_trim(0)
