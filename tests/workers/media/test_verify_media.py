"""``poolgate verify`` on a media model: texts and synthetic probe images, served path against transformers."""
import argparse
import json

import pytest

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.tools.verify_cli import add_arguments, main
from poolgate.workers.tools.verify_media import verify_media
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
