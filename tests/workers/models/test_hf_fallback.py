"""Architectures without a packed implementation run through transformers' AutoModel (padded)."""
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel

from poolgate.shared.config import WorkerConfig
from poolgate.shared.params import PoolingParams
from poolgate.workers.load.build import load_model
from tests.fakes import save_random
from tests.workers.pooled import pool_ids

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 40)) + [3]]


def _save(folder, config):
    return save_random(folder, AutoModel, config)


def _pool(model):
    return pool_ids(model, SEQS, PoolingParams(use_activation=False))


@pytest.mark.parametrize("kind", ["electra", "phi3"])  # an encoder and a decoder with no packed family
def test_fallback_matches_transformers(tmp_path, kind):
    if kind == "electra":
        config = AutoConfig.for_model("electra", vocab_size=100, embedding_size=32, hidden_size=32,
                                      num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                      max_position_embeddings=64)
    else:
        config = AutoConfig.for_model("phi3", vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                      max_position_embeddings=64, pad_token_id=0)
    ref = _save(tmp_path, config)
    runner = load_model(WorkerConfig(model_path=str(tmp_path), served_model_name="t", dtype="float32",
                                       max_batch_tokens=256))
    got = _pool(runner)
    with torch.no_grad():
        for s, g in zip(SEQS, got):
            hidden = ref(input_ids=torch.tensor([s])).last_hidden_state[0]
            want = hidden[-1] if kind == "phi3" else hidden[0]  # default pooling: LAST for decoders, CLS else
            np.testing.assert_allclose(g, want.numpy(), atol=2e-5, rtol=1e-4)
