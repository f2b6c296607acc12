"""poolgate verify: the probes against the model's own library (token tasks token by token), the exit code by
threshold, --verify-on-start."""
import dataclasses

import numpy as np
import pytest

from poolgate.gateway.cli import main as cli
from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.load.st_config import read_spec
from poolgate.workers.tools import verify
from poolgate.workers.tools.verify import PROBES, verify_loaded
from tests.workers.encoder_families import save_tiny


def _worst(out: str, task: str) -> float:
    line = next(x for x in out.splitlines() if x.split()[0] == task)
    assert "float32" in line
    return float(line.split("worst cosine ")[1].split()[0])


def test_the_bundled_model_agrees_with_sentence_transformers(capsys):
    """embed against sentence-transformers, token_embed token by token against transformers: nothing skipped."""
    assert cli(["verify", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert _worst(out, "embed") > 0.99999 and _worst(out, "token_embed") > 0.99999
    assert "skipped" not in out and out.rstrip().endswith("PASS (threshold 0.999)")


def test_a_threshold_the_model_does_not_reach_exits_1(tmp_path, capsys):
    save_tiny(tmp_path, "bert", head="sequence_classification", num_labels=3)
    assert cli(["verify", str(tmp_path), "--dtype", "bfloat16", "--threshold", "1.0"]) == 1
    out = capsys.readouterr().out
    assert "classify       bfloat16" in out and out.rstrip().endswith("FAIL (threshold 1.0)")


def test_a_classifier_is_checked_against_transformers(tmp_path):
    save_tiny(tmp_path, "bert", head="sequence_classification", num_labels=3)
    cfg = WorkerConfig(model=str(tmp_path), served_model_name="c", dtype="float32", max_batch_tokens=4096)
    checks, skipped = verify_loaded(load_model(cfg), read_spec(cfg))
    (row,) = checks
    assert row.task == "classify" and row.worst_cosine > 0.99999 and row.max_abs_diff < 1e-5
    assert skipped == ["token_classify"] and len(PROBES) >= 8


def test_verify_on_start_refuses_a_model_below_the_threshold(tmp_path):
    save_tiny(tmp_path, "bert", head="sequence_classification", num_labels=3)
    cfg = dict(model=str(tmp_path), served_model_name="c", max_batch_tokens=4096)
    assert load_model(WorkerConfig(**cfg, dtype="float32", verify_on_start=0.999)).info.tasks[0] == "classify"
    with pytest.raises(ValueError, match=r"--verify-on-start: .* below 1\.0: classify +bfloat16"):
        load_model(WorkerConfig(**cfg, dtype="bfloat16", verify_on_start=1.0))


@pytest.mark.parametrize("use_activation", [None, False])
def test_a_token_classifier_is_checked_token_by_token(tmp_path, use_activation):
    """A *ForTokenClassification checkpoint: every probe token's label distribution (or, with the pooler
    config's use_activation off, its logits) against transformers'."""
    save_tiny(tmp_path, "bert", head="token_classification", num_labels=5)
    cfg = WorkerConfig(model=str(tmp_path), served_model_name="n", dtype="float32", max_batch_tokens=4096,
                       pooler_config=PoolerConfig(use_activation=use_activation))
    model = load_model(cfg)
    checks, skipped = verify_loaded(model, read_spec(cfg))
    (row,) = checks
    assert row.task == "token_classify" and row.worst_cosine > 0.99999 and row.max_abs_diff < 1e-5
    assert row.batched_vs_single > 0.99999 and skipped == []
    rows = verify.served(model, verify.probe_ids(model), "token_classify", batched=True)
    assert np.allclose(rows.sum(1), 1.0, atol=1e-5) == (use_activation is None)  # probabilities, or logits


def test_an_embedders_token_vectors_are_checked_and_what_verify_cannot_reproduce_is_skipped(tmp_path):
    save_tiny(tmp_path, "bert")
    cfg = WorkerConfig(model=str(tmp_path), served_model_name="e", dtype="float32", max_batch_tokens=4096)
    spec = read_spec(cfg)
    checks, skipped = verify_loaded(load_model(cfg), spec)
    assert [c.task for c in checks] == ["embed", "token_embed"] and skipped == []
    assert all(c.worst_cosine > 0.99999 for c in checks)
    # a STEP pooling, a Dense projector or calibration sit between the model and the rows: no reference
    for changed in (dataclasses.replace(spec, pooler=PoolerConfig(tok_pooling_type="STEP")),
                    dataclasses.replace(spec, dense=(object(),)),
                    dataclasses.replace(spec, pooler=PoolerConfig(logit_mean=0.5))):
        assert verify.reference_outputs(changed, "token_embed") is None


def test_a_token_count_that_differs_from_the_reference_fails(tmp_path, monkeypatch):
    """Tokenizers that split a probe differently leave no row to compare: the check fails (-1), it does not
    compare the wrong tokens or crash."""
    save_tiny(tmp_path, "bert")
    cfg = WorkerConfig(model=str(tmp_path), served_model_name="e", dtype="float32", max_batch_tokens=4096)
    real = verify._transformers
    monkeypatch.setattr(verify, "_transformers", lambda spec, task: real(spec, task)[1:])
    checks, _ = verify_loaded(load_model(cfg), read_spec(cfg))
    row = next(c for c in checks if c.task == "token_embed")
    assert row.worst_cosine == -1.0 and not row.passes(0.5) and np.isinf(row.max_abs_diff)
    assert row.batched_vs_single > 0.99999
