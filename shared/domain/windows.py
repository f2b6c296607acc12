"""Long documents scored in token windows (torch-free): the window input, the windows a worker cut, their fold.

A ``WindowedText`` asks the worker to split a document into windows of its
content tokens (``max_windows`` at most, consecutive windows sharing
``overlap`` tokens; what is left after the last window is not read, as
Cohere's ``max_chunks_per_doc``). With a ``query`` each window is read with
it as one pair (a cross-encoder: the window is sized so that query, window
and the template's special tokens fit ``max_model_len``); without one, each
window is a text of its own (a bi-encoder's or late-interaction model's
document). A document that fits one window is one window: exactly the
un-windowed input. The worker answers one row per window and a ``Windows``:
how many sequences each input became and each window's character span in
its document, so a dialect can name the best window; ``fold`` turns window
scores into one score per document (max by default, or mean).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

FOLDS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {  # (window scores, first window of each doc)
    "max": lambda scores, starts: np.maximum.reduceat(scores, starts),
    "mean": lambda scores, starts: np.add.reduceat(scores, starts) / np.diff(np.append(starts, len(scores))),
}


@dataclass(frozen=True)
class WindowedText:
    """A document to read in token windows (see the module docstring); ``max_tokens`` cuts it first
    (``max_tokens_per_doc``), ``max_query_tokens`` cuts the query (``max_tokens_per_query``); 0 = off."""

    text: str
    max_windows: int
    overlap: int = 0
    query: str | None = None
    instruction: str | None = None
    max_query_tokens: int = 0
    max_tokens: int = 0


@dataclass(frozen=True)
class Windows:
    """How a call's inputs became sequences: input i became ``counts[i]``; sequence j covers characters
    ``spans[j]`` of its input's text (a plain input: one sequence, its whole text or ``(0, 0)``)."""

    counts: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if sum(self.counts) != len(self.spans) or min(self.counts, default=1) < 1:
            raise ValueError(f"{len(self.spans)} window spans for window counts {list(self.counts)}")

    def to_wire(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "spans": [list(s) for s in self.spans]}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Windows:
        return cls(tuple(int(c) for c in body["counts"]), tuple((int(a), int(b)) for a, b in body["spans"]))

    def starts(self) -> np.ndarray:
        """(inputs,) the first sequence of each input."""
        counts = np.asarray(self.counts, dtype=np.int64)
        return np.cumsum(counts) - counts


@dataclass(frozen=True)
class Folded:
    """One score per document and, per document, its best window: index among its windows and span."""

    scores: np.ndarray  # (documents,) float32
    best: list[tuple[int, int, int]]  # (window index, start, end) per document


def fold(window_scores: np.ndarray, counts: list[int], spans: list[tuple[int, int]], how: str) -> Folded:
    """Documents' scores from their windows' (in document order), by ``FOLDS[how]``; best = highest window."""
    starts = np.cumsum(counts) - np.asarray(counts)  # (documents,)
    scores = window_scores.astype(np.float32)
    folded = FOLDS[how](scores, starts).astype(np.float32)
    best = []
    for start, count in zip(starts.tolist(), counts, strict=True):
        k = int(np.argmax(scores[start : start + count]))
        best.append((k, *spans[start + k]))
    return Folded(folded, best)
