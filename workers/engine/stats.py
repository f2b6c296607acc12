"""The engine's running totals: each pipeline stage's time, the overlap, and batch shapes as histograms.

Read by the ``health`` op, so the gateway's /metrics shows batch size,
tokens and fill per worker, and logged once when the worker stops.
``tokens_per_s`` is the worker's measured capacity: tokens over seconds of
device time, both summed over recent batches with a decay (so big batches
weigh by their tokens and a run of tiny ones cannot drag it down); the batch
policy's time budget and the gateway's admission read it; 0 until a batch ran.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from poolgate.shared.telemetry import names
from poolgate.shared.telemetry.histogram import Histogram


RATE_DECAY = 0.9  # per batch, of the sums behind ``tokens_per_s``


@dataclass
class PipelineStats:
    """Totals since start: each stage's time, how much preparing hid behind executing, batch shapes."""

    batches: int = 0
    sequences: int = 0
    tokens: int = 0
    prepare_s: float = 0.0
    execute_s: float = 0.0
    prepare_overlapped_s: float = 0.0  # prepare time spent while a batch was executing
    tokens_per_s: float = 0.0  # decayed tokens over decayed device seconds (module doc)
    _rate_tokens: float = field(default=0.0, repr=False)
    _rate_seconds: float = field(default=0.0, repr=False)
    out_of_memory: int = 0  # batches that ran out of device memory and were split (workers.engine.oom)
    batch_size: Histogram = field(default_factory=lambda: Histogram(names.BATCH_SIZE_BUCKETS))
    batch_tokens: Histogram = field(default_factory=lambda: Histogram(names.TOKEN_BUCKETS))
    batch_fill: Histogram = field(default_factory=lambda: Histogram(names.FILL_BUCKETS))

    def record_batch(self, sequences: int, tokens: int, budget: int, seconds: float = 0.0) -> None:
        if seconds > 0:
            self._rate_tokens = RATE_DECAY * self._rate_tokens + tokens
            self._rate_seconds = RATE_DECAY * self._rate_seconds + seconds
            self.tokens_per_s = self._rate_tokens / self._rate_seconds
        self.batches += 1
        self.sequences += sequences
        self.tokens += tokens
        self.batch_size.observe(sequences)
        self.batch_tokens.observe(tokens)
        self.batch_fill.observe(min(tokens / budget, 1.0))

    def to_wire(self) -> dict:
        body = {k: v for k, v in asdict(self).items()
                if not k.startswith("_") and not isinstance(getattr(self, k), Histogram)}
        return {**body, "batch_size": self.batch_size.to_wire(), "batch_tokens": self.batch_tokens.to_wire(),
                "batch_fill": self.batch_fill.to_wire()}
