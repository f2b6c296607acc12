"""The load settings (admission's queued-work limit, the worker's batch policy) from flags and the config file."""
from __future__ import annotations

import argparse
import textwrap

import pytest

from poolgate.gateway import serve
from poolgate.gateway.config.given import parse_noting_given


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    serve.add_arguments(p)
    return p


def from_flags(*flags: str):
    return serve.config_from_args(parser().parse_args(list(flags)), {})


def from_file(text: str, tmp_path, *flags: str):
    path = tmp_path / "serve.toml"
    path.write_text(textwrap.dedent(text))
    return serve.config_from_args(parse_noting_given(serve.add_arguments, ["--config", str(path), *flags]), {})


def test_admission_is_on_by_default_and_the_flags_change_it():
    assert from_flags().max_queued_s == 5.0 and from_flags().max_queued_tokens is None
    assert from_flags("--max-queued-seconds", "0").max_queued_s is None  # 0 = no limit
    config = from_flags("--max-queued-seconds", "2.5", "--max-queued-tokens", "50000")
    assert (config.max_queued_s, config.max_queued_tokens) == (2.5, 50000)
    with pytest.raises(SystemExit):
        from_flags("--max-queued-seconds", "-1")


def test_the_batch_policy_is_fair_by_default_and_fifo_on_request(tmp_path):
    assert from_flags().pools[0].workers[0].batch_policy == "fair"
    assert from_flags("--batch-policy", "fifo").pools[0].workers[0].batch_policy == "fifo"
    config = from_file("""\
        max_queued_seconds = 3
        max_queued_tokens = 9000
        [[models]]
        batch_policy = "fifo"
        """, tmp_path)
    assert (config.max_queued_s, config.max_queued_tokens) == (3, 9000)
    assert config.pools[0].workers[0].batch_policy == "fifo"
    assert from_file("[[models]]\n", tmp_path, "--max-queued-seconds", "1").max_queued_s == 1.0


def test_a_bad_batch_policy_in_the_file_names_its_key(tmp_path):
    with pytest.raises(ValueError, match=r"models\[0\]\.batch_policy.*must be one of"):
        from_file("[[models]]\nbatch_policy = \"lifo\"\n", tmp_path)


def test_max_tokens_per_request_is_a_model_setting(tmp_path):
    assert from_flags().pools[0].workers[0].max_tokens_per_request is None
    assert from_flags("--max-tokens-per-request", "900").pools[0].workers[0].max_tokens_per_request == 900
    config = from_file("[[models]]\nmax_tokens_per_request = 800\n", tmp_path)
    assert config.pools[0].workers[0].max_tokens_per_request == 800
