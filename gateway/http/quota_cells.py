"""Where the tenants' quota numbers live: a list in one gateway process, an mmap'ed file shared by several.

A tenant's token buckets (level and time of each) and its requests in flight
are float cells (``gateway.http.tenants``). With one gateway process they are
a plain list (``LocalCells``). With ``--gateway-processes N`` every process
maps one small file in the processes' private folder (``SharedCells``; the
parent creates it before any other process starts, zeroed, then fills it), and
each read-modify-write of a bucket or a count holds an exclusive ``flock`` on
it, so a quota holds across the processes: ``Bucket.take_if`` and
``Tally.enter`` check and take in one step. ``CLOCK_MONOTONIC`` is one clock
for the whole host, so a bucket's time means the same in every process.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

CELL_BYTES = 8  # one float64


class Floats(Protocol):
    """Cells by number: a list, or a memoryview of float64."""

    def __getitem__(self, i: int, /) -> float: ...

    def __setitem__(self, i: int, value: float, /) -> None: ...


class Cells(Protocol):
    """Numbered float cells, changed only while ``locked``; ``fresh``: this process made them (it fills them)."""

    fresh: bool

    def locked(self) -> contextlib.AbstractContextManager[Floats]: ...


class LocalCells:
    """Cells in this process alone (one gateway process)."""

    fresh = True

    def __init__(self, count: int) -> None:
        self.values = [0.0] * count

    def locked(self) -> contextlib.AbstractContextManager[Floats]:
        return contextlib.nullcontext(self.values)


class SharedCells:
    """Cells in a file every gateway process maps (module doc); ``create``: the parent's, made here, zeroed."""

    def __init__(self, path: Path, count: int, *, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o600)
        size = max(1, count) * CELL_BYTES
        if create:
            os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.view = memoryview(self.map).cast("d")
        self.fresh = create

    @contextlib.contextmanager
    def locked(self) -> Iterator[Floats]:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield self.view
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


class Tally:
    """A count in one cell (a tenant's requests in flight, across the processes)."""

    def __init__(self, cells: Cells | None = None, slot: int = 0) -> None:
        self.cells, self.slot = cells or LocalCells(1), slot

    @property
    def value(self) -> int:
        with self.cells.locked() as v:
            return int(v[self.slot])

    def enter(self, cap: int | None) -> bool:
        """Count one in unless ``cap`` are in already (None: no cap); whether it was counted."""
        with self.cells.locked() as v:
            if cap is not None and v[self.slot] >= cap:
                return False
            v[self.slot] += 1
            return True

    def leave(self) -> None:
        with self.cells.locked() as v:
            v[self.slot] -= 1
