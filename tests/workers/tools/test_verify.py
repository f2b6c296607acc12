"""poolgate verify: the probes against the model's own library, the exit code by threshold, --verify-on-start."""
import pytest

from poolgate.gateway.cli import main as cli
from poolgate.shared.config import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.load.st_config import read_spec
from poolgate.workers.tools.verify import PROBES, verify_loaded
from tests.workers.encoder_families import save_tiny


def test_the_bundled_model_agrees_with_sentence_transformers(capsys):
    assert cli(["verify", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("embed"))
    assert "float32" in line and float(line.split("worst cosine ")[1].split()[0]) > 0.99999
    assert "skipped (no reference in verify): token_embed" in out and out.rstrip().endswith("PASS (threshold 0.999)")


def test_a_threshold_the_model_does_not_reach_exits_1(tmp_path, capsys):
    save_tiny(tmp_path, "bert", head="sequence_classification", num_labels=3)
    assert cli(["verify", str(tmp_path), "--dtype", "bfloat16", "--threshold", "1.0"]) == 1
    out = capsys.readouterr().out
    assert "classify  bfloat16" in out and out.rstrip().endswith("FAIL (threshold 1.0)")


def test_a_classifier_is_checked_against_transformers(tmp_path):
    save_tiny(tmp_path, "bert", head="sequence_classification", num_labels=3)
    cfg = WorkerConfig(model_path=str(tmp_path), served_model_name="c", dtype="float32", max_batch_tokens=4096)
    checks, skipped = verify_loaded(load_model(cfg), read_spec(cfg))
    (row,) = checks
    assert row.task == "classify" and row.worst_cosine > 0.99999 and row.max_abs_diff < 1e-5
    assert skipped == ["token_classify"] and len(PROBES) >= 8


def test_verify_on_start_refuses_a_model_below_the_threshold(tmp_path):
    save_tiny(tmp_path, "bert", head="sequence_classification", num_labels=3)
    cfg = dict(model_path=str(tmp_path), served_model_name="c", max_batch_tokens=4096)
    assert load_model(WorkerConfig(**cfg, dtype="float32", verify_on_start=0.999)).info.tasks[0] == "classify"
    with pytest.raises(ValueError, match=r"--verify-on-start: .* below 1\.0: classify  bfloat16"):
        load_model(WorkerConfig(**cfg, dtype="bfloat16", verify_on_start=1.0))
