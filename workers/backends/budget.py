"""The token budget of one batch on a GPU, from the device's memory and the model's size (pure arithmetic).

Without ``--max-batch-tokens`` a GPU worker sizes its batches from what it has:
the device's total memory times ``fraction`` (the rest is left to the caching
allocator's slack, CUDA graphs' pool and the pooled outputs), split between
the ``replicas`` workers that share the device (``--replicas-per-device``),
less the model's weights, divided by what one token row costs at the peak of a
layer in inference: the residual stream, its normed copy, q/k/v and the
attention output (about 7 × hidden) plus the feed-forward's inner rows (2 ×
intermediate: the up projection and, for gated MLPs, the gate or the
activation's output), in the model's dtype, times ``slack`` for the
allocator's rounding. No layer's activations outlive it (no autograd), so the
number of layers enters only through the weights. The result is rounded down
to a multiple of 1024 and held within ``low .. high``: past ``high`` a bigger
batch adds latency and no throughput on any GPU we know of.
"""
from __future__ import annotations

from dataclasses import dataclass

LOW, HIGH = 2048, 65536


@dataclass(frozen=True)
class Budget:
    """The chosen budget and the figures it came from (logged at start)."""

    tokens: int
    per_token_bytes: int
    usable_bytes: int
    bounded: str  # "", "low" or "high": which bound held it

    def line(self) -> str:
        held = f", held at the {self.bounded} bound" if self.bounded else ""
        return (f"{self.tokens} tokens per batch ({self.usable_bytes >> 20} MiB for activations / "
                f"{self.per_token_bytes} bytes per token{held})")


def per_token_bytes(hidden: int, intermediate: int, dtype_bytes: int, slack: float = 2.0) -> int:
    """Peak bytes one token row needs inside a layer (see the module's docstring)."""
    if hidden < 1 or intermediate < 0 or dtype_bytes < 1:
        raise ValueError(f"hidden={hidden}, intermediate={intermediate}, dtype_bytes={dtype_bytes}")
    return int(slack * dtype_bytes * (7 * hidden + 2 * intermediate))


def token_budget(*, total_bytes: int, weight_bytes: int, hidden: int, intermediate: int, dtype_bytes: int,
                 replicas: int = 1, fraction: float = 0.5, low: int = LOW, high: int = HIGH) -> Budget:
    """The token budget of one worker on a device of ``total_bytes`` shared by ``replicas`` workers."""
    if replicas < 1 or not 0 < fraction <= 1 or total_bytes < 1:
        raise ValueError(f"replicas={replicas}, fraction={fraction}, total_bytes={total_bytes}")
    row = per_token_bytes(hidden, intermediate or 4 * hidden, dtype_bytes)
    usable = max(0, int(total_bytes * fraction) // replicas - weight_bytes)
    tokens = usable // row // 1024 * 1024
    bounded = "low" if tokens < low else "high" if tokens > high else ""
    return Budget(min(high, max(low, tokens)), row, usable, bounded)
