"""The contract between the worker's engine and a model (torch-free): runner, loaded model.

Like text-embeddings-inference's queue/backend split, the engine owns
everything about calls of token ids (checking, queueing, batching; the ids
come tokenized from ``shared.inputs``) and a runner only turns a batch of token-id sequences into outputs, in two steps
the engine overlaps: ``prepare`` (host work: packing, buffers, the copy to the
device) for batch N+1 runs while ``execute`` (forward + pooling) runs batch N.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from poolgate.shared.wire.rows import Rows
from poolgate.shared.inputs.encoded import TextEncoder
from poolgate.shared.wire.messages import ModelInfo
from poolgate.workers.engine.sequence import Sequence


Step = tuple[str, float, float]  # (name, perf_counter start, end) of one runner step, for detailed traces


@dataclass(frozen=True)
class RunOutput:
    """The outputs of the batch's sequences ``start..stop`` (one run of equal params); for a multi-output
    run (``PoolingParams.outputs``), ``more`` holds its further outputs' rows, in order."""

    start: int
    stop: int
    rows: Rows
    more: tuple[Rows, ...] = ()


def join_outputs(outputs: list[RunOutput]) -> list[RunOutput]:
    """A runner's outputs with a multi-output run's outputs as one ``RunOutput``.

    A runner pools a multi-output run once per output, over the same sequences, and reports one
    ``RunOutput`` per output, consecutive and in order (two runs of different params never cover the
    same sequences); this folds each such group into its first, the others' rows in ``more``."""
    if len(outputs) < 2:
        return outputs
    joined = [outputs[0]]
    for run in outputs[1:]:
        last = joined[-1]
        if run.start == last.start and run.stop == last.stop:
            joined[-1] = RunOutput(last.start, last.stop, last.rows, (*last.more, run.rows, *run.more))
        else:
            joined.append(run)
    return joined


class Runner(Protocol):
    """Runs batches for the engine; the real one is ``workers.engine.runner.PoolingRunner``.

    ``prepare`` and ``execute`` are called from two different threads, one
    batch at a time each; ``execute`` gets batches in the order they were prepared.
    """

    def prepare(self, seqs: list[Sequence]) -> Any:
        """Everything before the forward: pack ``seqs`` and move them to the device."""
        ...

    def execute(self, batch: Any, steps: list[Step] | None = None) -> list[RunOutput]:
        """Forward + pooling for a prepared batch; outputs cover every sequence, in order.

        With ``steps`` (detailed tracing), append ``("forward", start, end)`` and
        ``("pool", start, end)`` perf_counter readings, waiting for the device
        between them so each step's time is its own."""
        ...


@dataclass(frozen=True)
class LoadedModel:
    """What a worker serves: built once, at start-up, by the runner factory."""

    info: ModelInfo
    encoder: TextEncoder
    runner: Runner
    max_batch_tokens: int  # the engine's token budget per batch
    device_memory: Callable[[], dict[str, int]] | None = None  # bytes by kind, where the backend reports it
    padded: bool = False  # batches run padded (transformers fallback): the budget counts count × longest
    cache_bytes: int = 0  # the embedding cache's bound (--embedding-cache-mb; workers.engine.cache); 0 = off
