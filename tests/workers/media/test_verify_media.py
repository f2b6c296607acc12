"""``poolgate verify`` on a media model: texts and synthetic probe images, served path against transformers."""
import argparse
import json

import pytest

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.tools.verify_cli import add_arguments, main
from poolgate.workers.tools.verify_media import refuse_media_below, verify_media
from tests.workers.media.dual_encoders import make_dual


@pytest.mark.parametrize("kind", ["clip", "siglip", "siglip2"])
def test_verify_passes_each_tower(tmp_path, capsys, kind):
    make_dual(tmp_path, kind)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args([str(tmp_path), "--dtype", "float32"])) == 0
    out = capsys.readouterr().out
    assert "embed text     float32" in out and "embed image    float32" in out and "PASS" in out


def test_verify_catches_a_processor_that_differs(tmp_path):
    make_dual(tmp_path, "clip")
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32"))
    path = tmp_path / "preprocessor_config.json"  # the reference now normalizes otherwise than the served plan
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "image_mean": [0.9, 0.1, 0.5], "image_std": [0.1, 0.9, 0.2]}))
    checks, skipped = verify_media(model, str(tmp_path))
    rows = {c.task: c for c in checks}
    assert not skipped and rows["embed text"].passes(0.999) and not rows["embed image"].passes(0.999)


def test_verify_on_start_loads_a_media_model_that_agrees_and_refuses_one_that_does_not(tmp_path):
    make_dual(tmp_path, "siglip")
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32",
                                    verify_on_start=0.999))
    assert model.info.modalities == ("text", "image")
    path = tmp_path / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "image_mean": [0.9, 0.1, 0.5]}))
    with pytest.raises(ValueError, match="--verify-on-start: .* below 0.999: embed image"):
        refuse_media_below(model, str(tmp_path), 0.999)


async def test_verify_runs_where_the_callers_thread_runs_a_loop(tmp_path):
    """The offline API loads (and verifies) from a notebook's thread, whose event loop is running."""
    make_dual(tmp_path, "clip")
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32"))
    checks, _ = verify_media(model, str(tmp_path))
    assert [c.task for c in checks] == ["embed text", "embed image"] and all(c.passes(0.999) for c in checks)


@pytest.mark.parametrize("make", ["vit", "convnext", "wav2vec2", "ast", "whisper"])
def test_verify_checks_image_and_audio_classifiers(tmp_path, capsys, make):
    from tests.workers.media import classifiers as tiny

    if make == "wav2vec2":
        tiny.wav2vec2(tmp_path, layer_norm=True)
    else:
        getattr(tiny, make)(tmp_path)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args([str(tmp_path), "--dtype", "float32"])) == 0
    out = capsys.readouterr().out
    kind = "audio" if make in ("wav2vec2", "ast", "whisper") else "image"
    assert f"classify {kind} float32" in out and "PASS" in out, out


def test_verify_catches_a_classifier_whose_processor_differs(tmp_path):
    from tests.workers.media import classifiers as tiny

    tiny.vit(tmp_path)
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32"))
    path = tmp_path / "preprocessor_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "image_mean": [0.9, 0.1, 0.5], "image_std": [0.1, 0.9, 0.2]}))
    checks, skipped = verify_media(model, str(tmp_path))
    assert not skipped and len(checks) == 1 and not checks[0].passes(0.9999)


def test_verify_checks_a_qwen2_vl_embedder_and_catches_a_processor_that_differs(tmp_path, capsys):
    from tests.workers.models.media import qwen_vl_tiny as tiny

    tiny.make(tmp_path)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args([str(tmp_path), "--dtype", "float32"])) == 0
    out = capsys.readouterr().out
    assert "embed text     float32" in out and "embed image    float32" in out and "PASS" in out, out
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", dtype="float32"))
    path = tmp_path / "preprocessor_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "image_mean": [0.9, 0.1, 0.5], "image_std": [0.1, 0.9, 0.2]}))
    rows = {c.task: c for c in verify_media(model, str(tmp_path))[0]}
    assert rows["embed text"].passes(0.9999) and not rows["embed image"].passes(0.9999)


@pytest.mark.parametrize("name", ["colpali", "colqwen2", "colmodernvbert"])
def test_verify_checks_visual_late_interaction(tmp_path, capsys, name):
    from tests.workers.models.test_late_visual import FOLDERS

    FOLDERS[name](tmp_path)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert main(parser.parse_args([str(tmp_path), "--dtype", "float32"])) == 0
    out = capsys.readouterr().out
    assert "token_embed query float32" in out and "token_embed page float32" in out and "PASS" in out, out
