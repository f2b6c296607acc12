"""Masked LMs served as embedders (RobertaForMaskedLM and kin, a seed-table row): the packed encoder against
transformers' base model on the same checkpoint, fp32; the MLM head is left to the checkpoint, not refused."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForMaskedLM

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_tokenizer
from tests.workers.encoder_families import SEQS, tiny_config
from tests.workers.pooled import pool_ids


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "camembert"])
def test_a_masked_lm_embeds_as_its_encoder(tmp_path, model_type):
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_config(tiny_config(model_type)).save_pretrained(tmp_path, safe_serialization=True)
    make_tiny_tokenizer(tmp_path)
    assert any(k.startswith("lm_head.") for k in load_file(tmp_path / "model.safetensors"))
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="m", dtype="float32",
                                    max_batch_tokens=512))
    assert model.info.tasks == ("embed", "token_embed") and model.runner.model.__class__.__name__ == "BertEncoder"
    ref = AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        want = torch.stack([torch.nn.functional.normalize(ref(input_ids=torch.tensor([s])).last_hidden_state[0, 0],
                                                          dim=-1) for s in SEQS]).numpy()
    got = pool_ids(model, SEQS)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() > 0.99999 and np.abs(got - want).max() < 1e-5, (cos.min(), np.abs(got - want).max())
