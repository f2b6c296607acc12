"""Rows: the outputs of n inputs as one array block, split into per-input arrays only on demand.

A sequence-level task gives one row per input: ``values`` is ``(n, dim)`` and
``offsets`` is None. A token-level task gives a varying number of rows per
input: ``values`` is the flat ``(total_rows, dim)`` block and ``offsets`` the
``(n + 1,)`` int64 row offsets, input ``i`` owning ``values[offsets[i]:offsets[i + 1]]``.
The block crosses the transport as one or two arrays and is split only where a
dialect writes its response.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Rows:
    """n inputs' outputs: ``values`` (n, ...) or flat ``values`` plus ``offsets`` (n + 1,)."""

    values: np.ndarray
    offsets: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.offsets is not None:
            if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
                raise ValueError("offsets must be a 1-d array starting at 0")
            if int(self.offsets[-1]) != len(self.values):
                raise ValueError(f"offsets end at {int(self.offsets[-1])} but there are {len(self.values)} rows")

    def __len__(self) -> int:
        return len(self.values) if self.offsets is None else len(self.offsets) - 1

    def item(self, i: int) -> np.ndarray:
        """Input ``i``'s output: one row, or its block of rows."""
        if self.offsets is None:
            return self.values[i]
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def slice(self, start: int, stop: int) -> Rows:
        """Inputs ``start..stop`` as Rows of their own (views, no copy)."""
        if self.offsets is None:
            return Rows(self.values[start:stop])
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return Rows(self.values[lo:hi], self.offsets[start : stop + 1] - lo)

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        """The parts one after another (one copy; a single part is returned as it is)."""
        if len(parts) == 1:
            return parts[0]
        values = np.concatenate([p.values for p in parts])
        if all(p.offsets is None for p in parts):
            return Rows(values)
        ragged = [p.offsets for p in parts if p.offsets is not None]
        if len(ragged) != len(parts):
            raise ValueError("cannot join per-row and ragged outputs")
        ends = np.cumsum([0] + [len(p.values) for p in parts[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [o[1:] + end for o, end in zip(ragged, ends, strict=True)])
        return Rows(values, offsets.astype(np.int64))

    def arrays(self) -> list[np.ndarray]:
        """What travels in a frame: ``[values]`` or ``[values, offsets]``."""
        return [self.values] if self.offsets is None else [self.values, self.offsets]

    @classmethod
    def from_arrays(cls, arrays: list[np.ndarray]) -> Rows:
        """Inverse of ``arrays``."""
        if len(arrays) not in (1, 2):
            raise ValueError(f"expected 1 or 2 arrays for one call's outputs, got {len(arrays)}")
        return cls(arrays[0], arrays[1] if len(arrays) == 2 else None)
