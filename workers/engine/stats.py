"""The engine's running totals: each pipeline stage's time, the overlap, and batch shapes as histograms.

Read by the ``health`` op, so the gateway's /metrics shows batch size,
tokens and fill per worker, and logged once when the worker stops.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from poolgate.shared import telemetry as names
from poolgate.shared.histogram import Histogram


@dataclass
class PipelineStats:
    """Totals since start: each stage's time, how much preparing hid behind executing, batch shapes."""

    batches: int = 0
    sequences: int = 0
    tokens: int = 0
    prepare_s: float = 0.0
    execute_s: float = 0.0
    prepare_overlapped_s: float = 0.0  # prepare time spent while a batch was executing
    batch_size: Histogram = field(default_factory=lambda: Histogram(names.BATCH_SIZE_BUCKETS))
    batch_tokens: Histogram = field(default_factory=lambda: Histogram(names.TOKEN_BUCKETS))
    batch_fill: Histogram = field(default_factory=lambda: Histogram(names.FILL_BUCKETS))

    def record_batch(self, sequences: int, tokens: int, budget: int) -> None:
        self.batches += 1
        self.sequences += sequences
        self.tokens += tokens
        self.batch_size.observe(sequences)
        self.batch_tokens.observe(tokens)
        self.batch_fill.observe(min(tokens / budget, 1.0))

    def to_wire(self) -> dict:
        body = {k: v for k, v in asdict(self).items() if not isinstance(getattr(self, k), Histogram)}
        return {**body, "batch_size": self.batch_size.to_wire(), "batch_tokens": self.batch_tokens.to_wire(),
                "batch_fill": self.batch_fill.to_wire()}
