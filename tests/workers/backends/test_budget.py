"""The GPU token budget: grows with the device's memory, shrinks with the model and the replicas, bounded."""
import pytest

from poolgate.workers.backends.budget import HIGH, LOW, per_token_bytes, token_budget

GIB = 1 << 30
BERT_BASE = dict(hidden=768, intermediate=3072, dtype_bytes=2, weight_bytes=220 * (1 << 20))


def test_budget_follows_memory_model_and_replicas():
    small = token_budget(total_bytes=2 * GIB, **BERT_BASE)
    big = token_budget(total_bytes=4 * GIB, **BERT_BASE)
    assert LOW <= small.tokens < big.tokens and small.tokens % 1024 == 0
    # what the activations of the chosen batch take stays within the usable share
    assert small.tokens * small.per_token_bytes <= small.usable_bytes
    shared = token_budget(total_bytes=4 * GIB, replicas=2, **BERT_BASE)
    assert shared.tokens < big.tokens and shared.usable_bytes < big.usable_bytes
    wider = token_budget(total_bytes=2 * GIB, **{**BERT_BASE, "hidden": 1024, "intermediate": 4096})
    assert wider.tokens < small.tokens


def test_budget_bounds_and_says_so():
    h200 = token_budget(total_bytes=141 * GIB, **BERT_BASE)
    assert h200.tokens == HIGH and h200.bounded == "high" and "high bound" in h200.line()
    tiny = token_budget(total_bytes=1 * GIB, **{**BERT_BASE, "weight_bytes": GIB})
    assert tiny.tokens == LOW and tiny.bounded == "low" and tiny.usable_bytes == 0
    assert token_budget(total_bytes=141 * GIB, high=1 << 20, **BERT_BASE).tokens > HIGH


def test_per_token_bytes_and_bad_input():
    assert per_token_bytes(768, 3072, 2) == 2 * 2 * (7 * 768 + 2 * 3072)
    assert per_token_bytes(768, 3072, 4) == 2 * per_token_bytes(768, 3072, 2)
    with pytest.raises(ValueError):
        token_budget(total_bytes=GIB, replicas=0, **BERT_BASE)
    with pytest.raises(ValueError):
        per_token_bytes(0, 10, 2)
