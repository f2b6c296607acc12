"""One declaration per model setting: ``ModelSettings`` gives each setting its flag, its file key and its field."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Literal

import pytest
from pydantic import ValidationError

from poolgate.gateway.config.file import model_table, setting_error
from poolgate.shared.config import WorkerConfig
from poolgate.shared.model_flags import FOLDED, add_model_arguments, worker_config_from_args
from poolgate.shared.model_settings import ModelSettings, declared, setting


@dataclass(frozen=True)
class WithColour(ModelSettings):
    """ModelSettings plus one new setting, declared the one way a setting is declared."""

    colour: Literal["red", "blue"] = setting("red", help="the colour of the vectors")
    spin: int | None = setting(ge=1, le=3, metavar="TURNS", help="turns per batch")


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser, WithColour)
    return parser.parse_args(list(flags))


def test_a_new_setting_is_a_flag_with_its_choices_bounds_default_and_help():
    assert (parse().colour, parse().spin) == ("red", None)
    assert (parse("--colour", "blue", "--spin", "3").colour, parse("--spin", "3").spin) == ("blue", 3)
    parser = argparse.ArgumentParser()
    add_model_arguments(parser, WithColour)
    text = parser.format_help()
    assert "--colour {red,blue}" in text and "the colour of the vectors" in text and "--spin TURNS" in text


@pytest.mark.parametrize("flags", [("--colour", "green"), ("--spin", "0"), ("--spin", "4"), ("--spin", "x")])
def test_a_new_setting_refuses_a_bad_flag(flags, capsys):
    with pytest.raises(SystemExit):
        parse(*flags)
    assert flags[0] in capsys.readouterr().err


def test_a_new_setting_is_a_file_key_with_the_same_checks():
    table = model_table(WithColour)
    valid = table.model_validate({"colour": "blue", "spin": 2})
    assert (getattr(valid, "colour"), getattr(valid, "spin")) == ("blue", 2)  # noqa: B009 (fields made at run time)
    for body, message in [({"colour": "green"}, "must be one of 'red' or 'blue'"), ({"spin": 4}, "must be <= 3"),
                          ({"spin": 0}, "must be >= 1"), ({"spin": "2"}, "must be an integer"),
                          ({"colour_": "red"}, "unknown key")]:
        with pytest.raises(ValidationError) as info:
            table.model_validate(body)
        assert message in str(setting_error(info.value, table)), body
    assert "colour" not in model_table().model_fields  # the real table has only the real settings


def test_every_setting_is_a_flag_and_a_file_key():
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    defaults = vars(parser.parse_args([]))
    table = model_table()
    for item in declared():
        assert item.name in defaults, item.name
        assert defaults[item.name] == item.default_value(), item.name
        assert item.file_key in table.model_fields, item.name


def test_every_setting_reaches_the_worker_config(tmp_path):
    """A setting is the WorkerConfig field of its name, unless FOLDED says which field it becomes."""
    worker = {f.name for f in fields(WorkerConfig)}
    for item in declared():
        assert (FOLDED.get(item.name) or item.name) in worker, f"{item.name}: add it to WorkerConfig or FOLDED"
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args([str(tmp_path), "--tokenizer-threads", "5", "--embedding-cache-mb", "7", "--dtype",
                              "bfloat16", "--batch-policy", "fifo", "--verify-on-start", "--no-normalize"])
    cfg = worker_config_from_args(args)
    assert (cfg.tokenizer_threads, cfg.embedding_cache_mb, cfg.dtype, cfg.batch_policy) == (5, 7, "bfloat16", "fifo")
    assert (cfg.verify_on_start, cfg.pooler.use_activation, cfg.model_path) == (0.999, False, str(tmp_path))
