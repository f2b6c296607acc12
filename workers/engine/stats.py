"""The engine's running totals: each pipeline stage's time, the overlap, and batch shapes as histograms.

Read by the ``health`` op, so the gateway's /metrics shows batch size,
tokens and fill per worker, and logged once when the worker stops.
``tokens_per_s`` is the worker's measured capacity: a moving average of the
tokens per second of device time over recent batches (the batch policy's
time budget and the gateway's admission read it); 0 until a batch ran.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from poolgate.shared import telemetry as names
from poolgate.shared.histogram import Histogram


RATE_WEIGHT = 0.2  # the newest batch's weight in ``tokens_per_s``


@dataclass
class PipelineStats:
    """Totals since start: each stage's time, how much preparing hid behind executing, batch shapes."""

    batches: int = 0
    sequences: int = 0
    tokens: int = 0
    prepare_s: float = 0.0
    execute_s: float = 0.0
    prepare_overlapped_s: float = 0.0  # prepare time spent while a batch was executing
    tokens_per_s: float = 0.0  # moving average over batches (module doc)
    out_of_memory: int = 0  # batches that ran out of device memory and were split (workers.engine.oom)
    batch_size: Histogram = field(default_factory=lambda: Histogram(names.BATCH_SIZE_BUCKETS))
    batch_tokens: Histogram = field(default_factory=lambda: Histogram(names.TOKEN_BUCKETS))
    batch_fill: Histogram = field(default_factory=lambda: Histogram(names.FILL_BUCKETS))

    def record_batch(self, sequences: int, tokens: int, budget: int, seconds: float = 0.0) -> None:
        if seconds > 0:
            rate = tokens / seconds
            last = self.tokens_per_s
            self.tokens_per_s = rate if not last else RATE_WEIGHT * rate + (1 - RATE_WEIGHT) * last
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
