"""ColBERT as the Stanford layout ships it (HF_ColBERT): token vectors and MaxSim against the reference computation.

The reference is the HF_ColBERT model's own forward, re-created: transformers'
BertModel on the ``bert.*`` tensors, ``linear`` on every token, L2-normalized;
MaxSim is the sum over query tokens of the best dot product with a document token.
"""
import numpy as np
import pytest
import torch

from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows
from poolgate.shared.domain.scoring import maxsim_scores
from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.pooling.special import SPECIAL_MODELS
from tests.workers.load.test_whole_load import _load, colbert_layout

QUERIES = [[2, 10, 11, 3], [2, 40, 41, 42, 3]]
DOCS = [[2, 10, 12, 13, 14, 3], [2] + list(range(20, 50)) + [3], [2, 41, 3]]


def _reference(body, projection, ids):
    with torch.no_grad():
        out = [torch.nn.functional.normalize(body(input_ids=torch.tensor([s])).last_hidden_state[0] @ projection.T,
                                             dim=-1) for s in ids]
    return [o.numpy() for o in out]  # per sequence: (tokens, dim)


def _token_rows(model, ids) -> list[np.ndarray]:
    from poolgate.workers.engine.sequence import Sequence

    (run,) = model.runner.execute(model.runner.prepare([Sequence(s, PoolingParams(task="token_embed")) for s in ids]))
    offsets = run.rows.offsets
    return [run.rows.values[offsets[i]:offsets[i + 1]] for i in range(len(ids))]


def test_token_vectors_and_maxsim_match_the_reference(tmp_path):
    body, projection = colbert_layout(tmp_path, architecture="HF_ColBERT", dim=16)
    model = _load(tmp_path)
    assert model.info.tasks == SPECIAL_MODELS["HF_ColBERT"].tasks == ("token_embed",)
    assert model.info.embedding_dim == 16
    got, want = _token_rows(model, QUERIES + DOCS), _reference(body, projection, QUERIES + DOCS)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-5)
        assert np.abs(np.linalg.norm(g, axis=1) - 1).max() < 1e-5
    rows = Rows(np.concatenate(got[:1] + got[2:]), np.cumsum([0] + [len(g) for g in got[:1] + got[2:]]))
    scores = maxsim_scores(rows, 1)
    reference = [float((want[0] @ d.T).max(axis=1).sum()) for d in want[2:]]
    np.testing.assert_allclose(scores, reference, rtol=1e-5)


def test_a_dim_the_projection_does_not_have_is_refused(tmp_path):
    colbert_layout(tmp_path, architecture="HF_ColBERT", dim=24)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: linear\.weight projects to 16 dimensions, but "
                                              r"config\.json says dim=24"):
        _load(tmp_path)


def test_a_missing_projection_is_refused(tmp_path):
    colbert_layout(tmp_path, architecture="HF_ColBERT", change=lambda s: s.pop("linear.weight"))
    with pytest.raises(CheckpointError, match=r"HF_ColBERT checkpoint needs its projection linear\.weight"):
        _load(tmp_path)

