"""The synthetic benchmark corpus: deterministic per seed, the intended length shape."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.domain.corpus import MAX_WORDS, read_corpus, synthetic_corpus, vocabulary


def test_vocabulary_is_a_few_hundred_distinct_words():
    words = vocabulary()
    assert 300 <= len(words) <= 2000
    assert len(set(words)) == len(words)
    assert all(w.isalpha() and w.islower() for w in words)


def test_same_seed_same_corpus_other_seed_differs():
    assert synthetic_corpus(256, seed=3) == synthetic_corpus(256, seed=3)
    assert synthetic_corpus(256, seed=3) != synthetic_corpus(256, seed=4)
    assert len(synthetic_corpus(17)) == 17


def test_texts_use_only_vocabulary_words():
    vocab = set(vocabulary())
    for text in synthetic_corpus(64, seed=1):
        assert set(text.split()) <= vocab


def test_length_distribution_matches_the_baseline_corpus():
    # Every vocabulary word is one BERT token, so tokens = words + [CLS] + [SEP].
    tokens = np.array([len(t.split()) + 2 for t in synthetic_corpus(8192, seed=0)])
    assert 58 <= np.median(tokens) <= 66            # log-normal around 60 words
    assert 80 <= tokens.mean() <= 90                # mean ~85 tokens
    assert tokens.max() <= MAX_WORDS + 2 == 482     # capped like the baseline's max
    assert 0.94 <= (tokens <= 256).mean() <= 0.98   # most fit a 256-token model
    assert tokens.min() >= 6
    log_words = np.log(tokens - 2)
    assert 0.7 <= log_words.std() <= 0.9            # the log-normal's sigma


def test_read_corpus_skips_blank_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("first text\n\n  second text  \n\n", encoding="utf-8")
    assert read_corpus(path) == ["first text", "second text"]
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError):
        read_corpus(tmp_path / "empty.txt")
