"""Reused host staging buffers for a GPU's copies: one upload and one read-back per batch.

Pinned (page-locked) host memory is what lets a copy to or from a GPU run
asynchronously, and pinning is slow, so a worker keeps its pinned buffers:
``Staging`` hands out a buffer of a size class (a power of two of bytes, at
least 64 KiB) and takes it back once the copy that read it is done (an event's
``query``), keeping a few free per class. ``upload`` lays every tensor of a
packed batch into one buffer at 64-byte aligned offsets, moves the whole
buffer in one copy, and gives the batch back as views of the device copy
(one transfer instead of one per tensor); ``read_back`` does the reverse for
a batch's results: one device buffer of their bytes, one copy into a staging
buffer, then each result copied out of it (results outlive the buffer).
Nothing here needs a GPU: on the CPU the buffers are plain memory, which the
tests use.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from poolgate.workers.batch.packing import PackedBatch, map_tensors

ALIGN = 64
SMALLEST = 1 << 16


def size_class(nbytes: int) -> int:
    """The buffer size a request of ``nbytes`` is served from."""
    return max(SMALLEST, 1 << max(0, nbytes - 1).bit_length())


def layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    """Each tensor's byte offset in one buffer (aligned to ``ALIGN``) and the buffer's length."""
    offsets, end = [], 0
    for t in tensors:
        offsets.append(end)
        end += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return offsets, end


def views(flat: torch.Tensor, like: list[torch.Tensor], offsets: list[int]) -> list[torch.Tensor]:
    """Tensors shaped and typed as ``like``, viewing ``flat`` (uint8) at ``offsets``."""
    out = []
    for t, o in zip(like, offsets):
        n = t.numel() * t.element_size()
        out.append(flat[o:o + n].view(t.dtype).view(t.shape))
    return out


class Staging:
    """Host buffers by size class, pinned when ``pin``; at most ``keep`` kept free per class. Thread-safe:
    the engine's prepare thread uploads while its execute thread reads results back."""

    def __init__(self, pin: bool, keep: int = 4):
        self.pin, self.keep = pin, keep
        self._lock = threading.Lock()
        self._free: dict[int, list[torch.Tensor]] = {}
        self._busy: list[tuple[torch.Tensor, Callable[[], bool]]] = []
        self.allocated = 0  # buffers made so far (reuse keeps it flat)

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least ``nbytes`` that no copy in flight reads."""
        with self._lock:
            buf = self._reuse(size_class(nbytes))
            if buf is None:
                self.allocated += 1
        return torch.empty(size_class(nbytes), dtype=torch.uint8, pin_memory=self.pin) if buf is None else buf

    def _reuse(self, size: int) -> torch.Tensor | None:
        still = []
        for buf, done in self._busy:
            if done():
                free = self._free.setdefault(buf.numel(), [])
                if len(free) < self.keep:
                    free.append(buf)
            else:
                still.append((buf, done))
        self._busy = still
        free = self._free.get(size)
        return free.pop() if free else None

    def give(self, buf: torch.Tensor, done: Callable[[], bool]) -> None:
        """Take ``buf`` back; it is handed out again once ``done()`` says its copy finished."""
        with self._lock:
            self._busy.append((buf, done))


def upload(batch: PackedBatch, staging: Staging,
           move: Callable[[torch.Tensor], torch.Tensor]) -> tuple[PackedBatch, torch.Tensor]:
    """``batch`` as views of ``move(buffer)`` (``move``: the one copy to the device), and the staging buffer
    (give it back once that copy is done)."""
    host: list[torch.Tensor] = []
    map_tensors(batch, lambda t: host.append(t) or t)  # the order map_tensors visits them in
    offsets, total = layout(host)
    buf = staging.take(total)
    for t, v in zip(host, views(buf, host, offsets)):
        v.copy_(t)
    moved = iter(views(move(buf[:total]), host, offsets))
    return map_tensors(batch, lambda t: next(moved)), buf


def read_back(outputs: list[torch.Tensor], staging: Staging,
              move: Callable[[torch.Tensor, torch.Tensor], None], wait: Callable[[], None]) -> list[np.ndarray]:
    """``outputs`` as numpy: their bytes in one buffer, ``move(dst, src)`` (one copy into a staging buffer),
    ``wait()`` for it, then each result copied out, so the buffer is free again at once."""
    if not outputs:
        return []
    flat = torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in outputs])
    buf = staging.take(flat.numel())
    move(buf[:flat.numel()], flat)
    wait()
    out, start = [], 0
    for t in outputs:
        n = t.numel() * t.element_size()
        out.append(buf[start:start + n].clone().view(t.dtype).view(t.shape).numpy())
        start += n
    staging.give(buf, lambda: True)
    return out
