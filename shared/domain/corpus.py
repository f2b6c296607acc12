"""The benchmark corpus: a seeded synthetic one, or one text per line of a file.

The synthetic corpus matches the one behind the baseline figures in
``reference/models.md``: random common English words (``words.txt``, each one
BERT-uncased token), word counts log-normal with median 60 and sigma 0.82, so
texts average ~85 tokens with [CLS]/[SEP]; counts are capped at 480 words
(482 tokens), and about 96% of texts fit a 256-token model.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from itertools import pairwise
from pathlib import Path

import numpy as np

MEDIAN_WORDS = 60
SIGMA = 0.82
MIN_WORDS = 4
MAX_WORDS = 480


@lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """The shipped word list, one word a line."""
    text = resources.files("poolgate.shared.domain").joinpath("words.txt").read_text(encoding="utf-8")
    return tuple(w for w in text.split() if w)


def word_counts(num_texts: int, seed: int = 0) -> np.ndarray:
    """Per-text word counts, log-normal around ``MEDIAN_WORDS``, clipped.  # (num_texts,)"""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(mean=np.log(MEDIAN_WORDS), sigma=SIGMA, size=num_texts)
    return np.clip(np.rint(raw), MIN_WORDS, MAX_WORDS).astype(np.int64)


def synthetic_corpus(num_texts: int = 4096, seed: int = 0) -> list[str]:
    """``num_texts`` texts of random vocabulary words; the same for the same seed."""
    if num_texts < 1:
        raise ValueError("num_texts must be at least 1")
    words = np.asarray(vocabulary())
    counts = word_counts(num_texts, seed)
    rng = np.random.default_rng([seed, 1])
    picks = rng.integers(0, len(words), size=int(counts.sum()))  # (total_words,)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    return [" ".join(words[picks[a:b]]) for a, b in pairwise(bounds)]


def fixed_length_corpus(num_texts: int, words: int, seed: int = 0) -> list[str]:
    """``num_texts`` different texts of exactly ``words`` vocabulary words each (``words + 2`` BERT tokens with
    [CLS]/[SEP]): single-request latency runs, where no two requests may be the same text."""
    if num_texts < 1 or words < 1:
        raise ValueError("num_texts and words must be at least 1")
    vocab = np.asarray(vocabulary())
    picks = np.random.default_rng([seed, 2]).integers(0, len(vocab), size=(num_texts, words))
    return [" ".join(vocab[row]) for row in picks]


def read_corpus(path: str | Path) -> list[str]:
    """Non-empty lines of a UTF-8 file, stripped; raises if there are none."""
    texts = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError(f"corpus file {path} has no non-empty lines")
    return texts
