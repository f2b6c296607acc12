"""PyLate ColBERT folders against PyLate itself: token vectors and MaxSim scores of queries and documents.

The reference runs in PyLate's own venv (``.cache/pylate-venv``, made by
``.ci/run``: pylate 1.6.0 pins sentence-transformers 5.3 and transformers ≤ 5.3,
which the test env does not have) as a subprocess
(``tests/workers/pooling/pylate_reference.py``): it builds the tiny PyLate
folder from a tiny random BERT with PyLate itself, saves it as PyLate ships
models, and writes what its ``encode`` gives. poolgate loads that folder and
encodes the same texts by role through its input stage and runner.
"""
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows
from poolgate.shared.domain.scoring import maxsim_scores
from poolgate.shared.wire.messages import PoolingCall
from tests.fakes import make_tiny_checkpoint
from tests.workers.load.test_whole_load import _load

ROOT = Path(__file__).resolve().parents[3]
VENV_PYTHON = ROOT / ".cache" / "pylate-venv" / "bin" / "python"
REFERENCE = Path(__file__).with_name("pylate_reference.py")
QUERIES = ["w1 w2 w3", " w4, w5! w6 ", "w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19"]
DOCUMENTS = ["w1 w2, w9 w10.", "w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20 w21 w22 w23", "w3",
             "(w5) w6 w7?"]
SETTINGS = {
    "expansion, not attended": {"embedding_size": 16, "query_length": 12, "document_length": 16},
    "expansion attended, own markers and skiplist": {
        "embedding_size": 8, "query_length": 10, "document_length": 12, "attend_to_expansion_tokens": True,
        "query_prefix": "[unused0]", "document_prefix": "[unused1]", "skiplist_words": ["w3", ",", "w9"]},
    "no expansion": {"embedding_size": 16, "query_length": 8, "document_length": 32, "do_query_expansion": False},
}

MISSING = f"PyLate's venv {VENV_PYTHON} is missing (.ci/run makes it: python -m venv + pip install pylate==1.6.0)"


@pytest.fixture
def venv():
    """Skip where a developer has no PyLate venv; in CI (.ci/run always makes it) fail, so PyLate is never unchecked."""
    if not VENV_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(MISSING)
        pytest.skip(MISSING)


def _reference(tmp_path: Path, settings: dict) -> tuple[Path, list, list, np.ndarray]:
    base, folder, out = tmp_path / "base", tmp_path / "pylate", tmp_path / "ref"
    make_tiny_checkpoint(base)
    body = json.dumps({**settings, "queries": QUERIES, "documents": DOCUMENTS})
    run = subprocess.run([str(VENV_PYTHON), str(REFERENCE), str(base), str(folder), str(out), body],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    q = [np.load(out / f"q{i}.npy") for i in range(len(QUERIES))]
    d = [np.load(out / f"d{i}.npy") for i in range(len(DOCUMENTS))]
    return folder, q, d, np.load(out / "scores.npy")


def _served(model, texts: list[str], query_inputs: int) -> list[np.ndarray]:
    """Each text's token vectors as the worker serves them: the input stage by role, then the runner."""
    from poolgate.shared.inputs.stage import InputStage
    from poolgate.workers.engine.sequence import Sequence

    params = PoolingParams(task="token_embed", query_inputs=query_inputs)
    encoded = InputStage(model.info, model.encoder).encode(PoolingCall("r", "t", texts, params))
    seqs = [Sequence(ids, params, attend=a) for ids, a in zip(encoded.ids, encoded.attend)]
    (run,) = model.runner.run(seqs)
    return [run.rows.values[run.rows.offsets[i]:run.rows.offsets[i + 1]] for i in range(len(texts))]


def _worst_cosine(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    worst = 1.0
    for g, w in zip(got, want):
        assert g.shape == w.shape
        cos = (g * w).sum(1) / (np.linalg.norm(g, axis=1) * np.linalg.norm(w, axis=1))
        worst = min(worst, float(cos.min()))
    return worst


@pytest.mark.parametrize("name", list(SETTINGS))
def test_vectors_and_maxsim_equal_pylates(tmp_path, venv, name):
    folder, want_q, want_d, want_scores = _reference(tmp_path, SETTINGS[name])
    model = _load(folder)
    assert model.info.tasks == ("token_embed",) and model.info.input_roles
    assert model.info.embedding_dim == SETTINGS[name]["embedding_size"]
    got = _served(model, QUERIES + DOCUMENTS, len(QUERIES))  # one call, queries first (a /score call's shape)
    got_q, got_d = got[:len(QUERIES)], got[len(QUERIES):]
    assert _worst_cosine(got_q, want_q) > 0.99999 and _worst_cosine(got_d, want_d) > 0.99999
    for g, w in zip(got, want_q + want_d):
        np.testing.assert_allclose(g, w, atol=2e-5)
    for i in range(len(QUERIES)):  # MaxSim of each query against every document, as /score computes it
        block = [got_q[i], *got_d]
        rows = Rows(np.concatenate(block), np.cumsum([0] + [len(b) for b in block]))
        np.testing.assert_allclose(maxsim_scores(rows, 1), want_scores[i], atol=1e-4)
    alone = _served(model, DOCUMENTS[:1], 0) + _served(model, QUERIES[:1], 1)  # all documents / all queries
    np.testing.assert_allclose(alone[0], want_d[0], atol=2e-5)
    np.testing.assert_allclose(alone[1], want_q[0], atol=2e-5)


def test_a_call_without_roles_or_with_token_ids_is_refused(tmp_path, venv):
    from poolgate.shared.inputs.stage import InputStage

    folder, *_ = _reference(tmp_path, SETTINGS["expansion, not attended"])
    model = _load(folder)
    stage = InputStage(model.info, model.encoder)
    with pytest.raises(InvalidRequest, match=r"say which the inputs are \(input_type query or document\)"):
        stage.encode(PoolingCall("r", "t", ["w1"], PoolingParams(task="token_embed")))
    with pytest.raises(InvalidRequest, match="pass the inputs as strings"):
        stage.encode(PoolingCall("r", "t", [[2, 5, 3]], PoolingParams(task="token_embed", query_inputs=1)))
    with pytest.raises(InvalidRequest, match="query_inputs must be between 0 and the 1 inputs, got 2"):
        stage.encode(PoolingCall("r", "t", ["w1"], PoolingParams(task="token_embed", query_inputs=2)))


def test_a_model_without_roles_refuses_query_inputs():
    from poolgate.shared.config.models import bundled_model_path
    from poolgate.shared.inputs.stage import InputStage

    model = _load(bundled_model_path())
    with pytest.raises(InvalidRequest, match="encodes queries and documents alike"):
        InputStage(model.info, model.encoder).encode(PoolingCall("r", "t", ["a"], PoolingParams(query_inputs=1)))


def test_a_marker_the_tokenizer_lacks_is_refused(tmp_path):
    make_tiny_checkpoint(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]))
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "ColBERT", "query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 8}))
    with pytest.raises(ValueError, match=r"config_sentence_transformers\.json: query_prefix '\[Q\] ' is not a token "
                                         r"of the folder's tokenizer"):
        _load(tmp_path)


def test_the_offline_api_says_roles_too(tmp_path, venv):
    from poolgate.workers.offline import PoolingModel

    folder, want_q, want_d, want_scores = _reference(tmp_path, SETTINGS["expansion, not attended"])
    with PoolingModel(str(folder), dtype="float32") as model:
        queries = model.encode(QUERIES, pooling_task="token_embed", input_type="query")
        documents = model.encode(DOCUMENTS, pooling_task="token_embed", input_type="document")
        for g, w in zip(queries + documents, want_q + want_d):
            np.testing.assert_allclose(g, w, atol=2e-5)
        np.testing.assert_allclose(model.score(QUERIES[2], DOCUMENTS), want_scores[2], atol=1e-4)


def test_max_model_len_covers_pylates_lengths_past_max_seq_length(tmp_path):
    from poolgate.shared.config.frozen import WorkerConfig
    from poolgate.workers.load.st_config import read_spec

    make_tiny_checkpoint(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 15}))
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "ColBERT", "query_length": 8, "document_length": 20}))
    assert read_spec(WorkerConfig(model=str(tmp_path), served_model_name="t")).max_model_len == 20  # 19 tokens + [D], as PyLate
    assert read_spec(WorkerConfig(model=str(tmp_path), served_model_name="t", max_model_len=12)).max_model_len == 12
