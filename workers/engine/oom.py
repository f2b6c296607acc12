"""Device out-of-memory recovery: a batch that ran out of memory runs again in halves, down to one input.

Torch-free: an out-of-memory error is recognised by its class name
(``torch.OutOfMemoryError``, which ``torch.cuda.OutOfMemoryError`` is; any
backend's error of that name). ``run_in_halves`` is called by the engine's
execute thread once a whole batch failed so: each half is prepared and run on
its own; a half that runs out of memory too is halved again; a single
sequence that cannot run alone is reported in ``too_big`` (its call gets a
400, the others are answered). Outputs keep the original batch's offsets.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from poolgate.workers.engine.runner_api import RunOutput, Step

OOM_CLASS_NAMES = frozenset({"OutOfMemoryError"})


def is_out_of_memory(exc: BaseException) -> bool:
    return any(cls.__name__ in OOM_CLASS_NAMES for cls in type(exc).__mro__)


@dataclass
class SplitRun:
    """What the halves produced: outputs over the original batch's offsets, and the sequences (by index)
    that ran out of memory alone."""

    outputs: list[RunOutput] = field(default_factory=list)
    too_big: list[int] = field(default_factory=list)
    runs: int = 0  # how many sub-batches ran (or tried to)


def run_in_halves(runner: Any, seqs: list, steps: list[Step] | None = None) -> SplitRun:
    """Run ``seqs`` (a batch that ran out of memory whole) as two halves, each halved again on
    out-of-memory; non-OOM errors propagate."""
    out = SplitRun()
    if len(seqs) == 1:
        out.too_big.append(0)
        return out
    mid = len(seqs) // 2
    for lo, part in ((0, seqs[:mid]), (mid, seqs[mid:])):
        out.runs += 1
        try:
            outputs = runner.execute(runner.prepare(part), steps)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            sub = run_in_halves(runner, part, steps)
            outputs, out.runs = sub.outputs, out.runs + sub.runs
            out.too_big += [lo + i for i in sub.too_big]
        out.outputs += [replace(run, start=run.start + lo, stop=run.stop + lo) for run in outputs]
    return out
