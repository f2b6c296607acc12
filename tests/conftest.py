"""Fakes for every seam: a fake runner (no torch), tiny random checkpoints."""
from __future__ import annotations

import numpy as np
import pytest

from shared.wire import ModelInfo
from workers.sequence import Sequence

CLS, SEP = 101, 102


class FakeRunner:
    """A deterministic runner: whitespace "tokens", vectors from token ids.

    Each word becomes one id; vectors depend only on a sequence's own ids, so
    batched equals single. ``batches`` records every batch it ran.
    """

    def __init__(self, *, name: str = "fake-model", max_model_len: int = 32, dim: int = 8,
                 matryoshka: bool = False):
        self.info = ModelInfo(
            served_model_name=name, architecture="FakeModel", tasks=("embed",),
            max_model_len=max_model_len, embedding_dim=dim, backend="cpu", dtype="float32",
            is_matryoshka=matryoshka,
        )
        self.batches: list[list[Sequence]] = []

    def encode_texts(self, texts: list[str], max_tokens: int | None = None) -> list[list[int]]:
        out = []
        for text in texts:
            ids = [1000 + sum(w.encode()) % 20000 for w in text.split()]
            if max_tokens is not None:
                ids = ids[: max(max_tokens - 2, 0)]
            out.append([CLS, *ids, SEP])
        return out

    def run(self, batch: list[Sequence]) -> list[np.ndarray]:
        self.batches.append(list(batch))
        return [self.vector(s.token_ids, s.params.dimensions, s.params.use_activation) for s in batch]

    def vector(self, ids: list[int], dimensions: int | None = None, normalize: bool | None = None):
        j = np.arange(1, self.info.embedding_dim + 1, dtype=np.float64)
        v = np.cos(np.outer(np.asarray(ids, dtype=np.float64), j) * 1e-3).sum(axis=0)
        v = v[:dimensions] if dimensions else v
        if normalize is not False:
            v = v / np.linalg.norm(v)
        return v.astype(np.float32)


@pytest.fixture
def fake_runner() -> FakeRunner:
    return FakeRunner()
