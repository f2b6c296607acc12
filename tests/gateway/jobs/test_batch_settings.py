"""The Batch API's settings: one declaration each, a serve flag and a config file key, off without ``batch_dir``."""
from __future__ import annotations

import textwrap

import pytest

from poolgate.gateway import serve
from poolgate.gateway.config.file import ConfigError
from poolgate.shared.config.frozen import BatchConfig
from poolgate.shared.config.models import bundled_model_path
from tests.gateway.config.test_config_file import load, parser

MB = 1024 * 1024


def test_off_without_batch_dir_and_openais_limits_by_default(tmp_path):
    assert serve.config_from_args(parser().parse_args([]), {}).batch is None
    config = serve.config_from_args(parser().parse_args(["--batch-dir", str(tmp_path / "b")]), {})
    assert config.batch == BatchConfig(dir=str(tmp_path / "b"), max_file_bytes=512 * MB, max_lines=50_000,
                                       tenant_bytes=None, max_inflight=64)


def test_flags_and_file_keys(tmp_path):
    flags = ["--batch-dir", "rel", "--batch-max-file-mb", "8", "--batch-max-lines", "100",
             "--batch-tenant-mb", "64", "--batch-max-inflight", "4"]
    from_flags = serve.config_from_args(parser().parse_args(flags), {}).batch
    assert from_flags.dir.endswith("/rel") and from_flags.dir.startswith("/")
    assert (from_flags.max_file_bytes, from_flags.max_lines, from_flags.tenant_bytes, from_flags.max_inflight) == (
        8 * MB, 100, 64 * MB, 4)
    from_file = load(f"""\
        batch_dir = "jobs"
        batch_max_file_mb = 8
        batch_tenant_mb = 64
        [[models]]
        model = "{bundled_model_path()}"
        """, tmp_path).batch
    assert from_file.dir == str(tmp_path / "jobs") and from_file.tenant_bytes == 64 * MB  # relative to the file


def test_bad_values_are_refused(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        serve.config_from_args(parser().parse_args(["--batch-dir", str(tmp_path / "a-file")]), {})
    with pytest.raises(SystemExit):
        parser().parse_args(["--batch-dir", "x", "--batch-max-lines", "0"])
    with pytest.raises(ConfigError, match="batch_max_inflight"):
        load(textwrap.dedent(f"""\
            batch_dir = "jobs"
            batch_max_inflight = 0
            [[models]]
            model = "{bundled_model_path()}"
            """), tmp_path)


def test_run_batch_refuses_batch_dir(tmp_path, caplog):
    import argparse

    from poolgate.gateway.jobs import run_batch

    p = argparse.ArgumentParser()
    run_batch.add_arguments(p)
    (tmp_path / "in.jsonl").write_text("")
    args = p.parse_args(["-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"),
                         "--batch-dir", str(tmp_path / "b")])
    assert run_batch.main(args) == 2
    assert "run-batch runs its one file" in caplog.text and not (tmp_path / "b").exists()
