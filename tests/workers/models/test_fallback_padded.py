"""The transformers fallback: still correct for architectures without a packed family, and its batches
are budgeted by their padded cost (count × longest), which is what it really computes."""
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel

from poolgate.shared.config import WorkerConfig
from poolgate.shared.params import PoolingParams
from poolgate.workers.load.build import load_model
from poolgate.workers.engine.engine import Engine
from poolgate.workers.engine.scheduler import TokenBudgetScheduler
from tests.fakes import save_random
from tests.workers.encoder_families import save_tiny
from tests.workers.pooled import pool_ids

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 40)) + [3]]


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


def _save(folder, kind):
    if kind == "electra":
        config = AutoConfig.for_model("electra", vocab_size=100, embedding_size=32, hidden_size=32,
                                      num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                      max_position_embeddings=64)
    else:
        config = AutoConfig.for_model("gpt2", vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=512,
                                      bos_token_id=2, eos_token_id=3,
                                      architectures=["GPT2Model"])
    return save_random(folder, AutoModel, config)


@pytest.mark.parametrize("kind", ["electra", "gpt2"])
def test_fallback_matches_transformers_and_is_budgeted_padded(tmp_path, kind):
    ref = _save(tmp_path, kind)
    model = load_model(WorkerConfig(model_path=str(tmp_path), served_model_name="t", dtype="float32",
                                    max_batch_tokens=256))
    assert model.padded and Engine(model).scheduler.padded
    got = pool_ids(model, SEQS, PoolingParams(use_activation=False))
    with torch.no_grad():
        for s, g in zip(SEQS, got):
            hidden = ref(input_ids=torch.tensor([s])).last_hidden_state[0]
            want = hidden[-1] if kind == "gpt2" else hidden[0]  # default pooling: LAST for decoders, CLS else
            np.testing.assert_allclose(g, want.numpy(), atol=2e-5, rtol=1e-4)


def test_packed_models_are_budgeted_by_real_tokens(tmp_path):
    save_tiny(tmp_path, "bert")
    model = load_model(WorkerConfig(model_path=str(tmp_path), served_model_name="t", dtype="float32",
                                    max_batch_tokens=256))
    assert not model.padded and not Engine(model).scheduler.padded
