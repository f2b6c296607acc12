"""The transformers fallback's batches are budgeted by their padded cost (count × longest), which is what it
really computes; packed models' by their real tokens. (Its outputs against transformers: test_hf_fallback.)"""
from dataclasses import dataclass

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.engine.engine import Engine
from poolgate.workers.engine.scheduler import TokenBudgetScheduler
from tests.workers.encoder_families import save_tiny


@dataclass(eq=False)
class Item:
    num_tokens: int
    cancelled: bool = False


def _cut(lengths, budget, padded):
    s = TokenBudgetScheduler(budget, padded=padded)
    for n in lengths:
        s.add(Item(n))
    return [i.num_tokens for i in s.next_batch(timeout=0)]


def test_padded_cost_is_count_times_longest():
    assert _cut([10, 2, 2, 2], 32, padded=False) == [10, 2, 2, 2]  # 16 real tokens
    assert _cut([10, 2, 2, 2], 32, padded=True) == [10, 2, 2]  # 3 × 10 = 30; a fourth makes 40
    assert _cut([2, 2, 2, 10], 24, padded=True) == [2, 2, 2]  # the long one would make it 4 × 10
    assert _cut([2, 2, 2, 10], 40, padded=True) == [2, 2, 2, 10]
    assert _cut([50, 2], 32, padded=True) == [50]  # the head always goes, even over budget


def test_packed_models_are_budgeted_by_real_tokens(tmp_path):
    save_tiny(tmp_path, "bert")
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32",
                                    max_batch_tokens=256))
    assert not model.padded and not Engine(model).scheduler.padded
