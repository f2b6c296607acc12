"""Bucketed counts of observations that a worker keeps and the gateway turns into Prometheus histograms.

A worker cannot share prometheus-client objects with the gateway's process,
so it keeps plain counts per bucket (upper bounds as Prometheus's ``le``, the
last bucket +Inf) and sends them over the transport as a dict; the gateway's
collector rebuilds the cumulative ``_bucket`` series from them.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Histogram:
    """Counts per bucket (``bounds`` ascending, plus +Inf), their sum and how many."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus's ``(le, cumulative count)`` pairs, +Inf last."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), running))
        return out

    def to_wire(self) -> dict[str, Any]:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.total}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Histogram:
        return cls(tuple(body["bounds"]), list(body["counts"]), float(body["sum"]))
