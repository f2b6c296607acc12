"""Architectures without a packed implementation run through transformers' AutoModel (padded), and match it."""
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.engine import Engine
from poolgate.workers.load.build import load_model
from tests.fakes import save_random
from tests.workers.pooled import pool_ids

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 40)) + [3]]
CONFIGS = {  # an encoder and two decoders with no packed family
    "electra": dict(vocab_size=100, embedding_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=64),
    "phi3": dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64, max_position_embeddings=64, pad_token_id=0),
    "gpt2": dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=512, bos_token_id=2, eos_token_id=3,
                 architectures=["GPT2Model"]),
}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_fallback_matches_transformers_and_is_budgeted_padded(tmp_path, kind):
    ref = save_random(tmp_path, AutoModel, AutoConfig.for_model(kind, **CONFIGS[kind]))
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32",
                                    max_batch_tokens=256))
    assert model.padded and Engine(model).scheduler.padded  # budgeted count × longest (test_fallback_padded)
    got = pool_ids(model, SEQS, PoolingParams(use_activation=False))
    with torch.no_grad():
        for s, g in zip(SEQS, got):
            hidden = ref(input_ids=torch.tensor([s])).last_hidden_state[0]
            want = hidden[0] if kind == "electra" else hidden[-1]  # default pooling: LAST for decoders, CLS else
            np.testing.assert_allclose(g, want.numpy(), atol=2e-5, rtol=1e-4)
