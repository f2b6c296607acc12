"""The contract between the worker's engine and a model runner (torch-free)."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from poolgate.shared.wire import ModelInfo
from poolgate.workers.sequence import Sequence


class Runner(Protocol):
    """Tokenizes and pools; the real one is ``workers.runner.PoolingRunner``."""

    info: ModelInfo
    max_batch_tokens: int  # the engine's token budget per batch

    def encode_texts(self, texts: list[str], max_tokens: int | None = None) -> list[list[int]]:
        """Token ids with special tokens; truncated as sentence-transformers does
        (tokenizer truncation to ``max_tokens``) when ``max_tokens`` is given."""
        ...

    def run(self, batch: list[Sequence]) -> list[np.ndarray]:
        """One float32 array per sequence, in order (for embed: shape (dim,))."""
        ...
