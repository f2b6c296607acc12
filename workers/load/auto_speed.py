"""``--dtype auto``'s speed check: the fast dtype is kept only where it runs faster here, timed at load.

A CPU class says which dtypes have instructions, not how fast they run: an
Intel Xeon's AVX512-BF16 (Cooper Lake, or a Sapphire Rapids shown as that
class) issues its bf16 dot products slowly enough that the bundled MiniLM
runs bf16 below fp32 there, where AMD's Zen 4 runs it well above (measured:
docs/operations.md "CPU classes"). So a backend whose classes differ so
(``Backend.times_auto_dtype``) times one fixed batch in both dtypes while
the model loads, and ``--dtype auto`` keeps the fast dtype only if it is not
slower. The fp32 side is timed before its last changes (``finalize``: the
CPU's prepacked fp32 linears, a few % faster), which leans the choice
towards the fast dtype; ``MARGIN`` keeps noise from switching it, and a
model so small that fp32 runs the batch in under ``MIN_TIMED_S`` keeps it too.
"""
from __future__ import annotations

import time

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.runner import PoolingRunner
from poolgate.workers.engine.sequence import Sequence

BATCH_SEQS, BATCH_LEN = 8, 128  # the timed batch: 1,024 tokens, one bucket, the shape of a typical request
ROUNDS = 2  # timed runs after one warm-up run; the best counts
MARGIN = 0.9  # the fast dtype goes only when it runs under 90% of fp32's tokens/s
MIN_TIMED_S = 0.02  # a batch fp32 runs faster than this (a tiny model) is too short to time: the fast dtype stays


def timing_batch(probes: list[list[int]], longest: int) -> list[list[int]]:
    """``BATCH_SEQS`` sequences of ``BATCH_LEN`` (at most ``longest``, the model's limit) real token ids, made
    from the start-up probes."""
    length = max(1, min(BATCH_LEN, longest))
    ids = [t for p in probes for t in p]
    ids = (ids * (length // max(1, len(ids)) + 1))[:length]
    return [ids[i:] + ids[:i] for i in range(BATCH_SEQS)]


def tokens_per_s(runner: PoolingRunner, batch: list[list[int]]) -> float:
    """The runner's best tokens/s over ``ROUNDS`` runs of ``batch``, after one warm-up run."""
    params = PoolingParams(task=runner.pooler.tasks[0])
    tokens = sum(map(len, batch))
    best = float("inf")
    for i in range(ROUNDS + 1):
        start = time.perf_counter()
        runner.run([Sequence(x, params) for x in batch])
        runner.backend.synchronize()
        if i:
            best = min(best, time.perf_counter() - start)
    return tokens / best


def keeps_fast(fast_tps: float, fp32_tps: float, tokens: int) -> bool:
    """Whether the fast dtype stays: not slower than ``MARGIN`` of fp32's tokens/s, or fp32 ran the batch of
    ``tokens`` in under ``MIN_TIMED_S`` (too short a time to tell the two apart on a busy machine)."""
    return fast_tps >= MARGIN * fp32_tps or tokens / fp32_tps < MIN_TIMED_S
