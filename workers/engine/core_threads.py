"""CPU core threads: one batch cut into parts at sequence boundaries, the parts run at once, one thread each.

On a CPU, one OpenMP team over every core stalls at each op's barrier whenever
any other thread (the gateway, the tokenizer, the prepare thread, a neighbour)
takes one of its cores; a part per core, each on a single-threaded core thread, has
no barrier to wait at. ``cut`` splits a batch into parts of about equal
tokens (never a sequence in two), ``CoreThreads`` runs a function over them on its
threads (each set to one torch thread) and gives the results in order.
Measured in-process on this project's shared 2-core machine (the bundled
MiniLM in bf16, 8,192-token batches, other work on the machine): two core threads ran
3-7x the tokens/s of one process-wide team of two threads.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")
R = TypeVar("R")


def cut(lengths: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """(start, stop) of at most ``parts`` contiguous, non-empty parts of about equal total length: each cut
    at the sequence boundary nearest to its share of the tokens."""
    prefix = np.concatenate([[0], np.cumsum(lengths)])  # (n + 1,) tokens before each boundary
    n, bounds = len(lengths), [0]
    for k in range(1, parts):
        target = prefix[-1] * k / parts
        i = int(np.clip(np.searchsorted(prefix, target), 1, n - 1))
        if target - prefix[i - 1] < prefix[i] - target:
            i -= 1
        if bounds[-1] < i < n:
            bounds.append(i)
    bounds.append(n)
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


class CoreThreads:
    """``n`` single-threaded core threads: threads started for each call (a few microseconds against a batch's
    milliseconds), so a runner holds no thread between batches and nothing outlives it."""

    def __init__(self, n: int):
        self.n = n

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``fn`` over ``items`` at once, results in order; the first error is raised after all finish."""
        results: list = [None] * len(items)
        errors: list[BaseException | None] = [None] * len(items)

        def run_one(i: int) -> None:
            torch.set_num_threads(1)
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # handed to the caller below, in order
                errors[i] = exc

        threads = [threading.Thread(target=run_one, args=(i,), name=f"poolgate-core-{i}") for i in range(len(items))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for error in errors:
            if error is not None:
                raise error
        return results
