"""One declaration per model setting: ``ModelSettings`` gives each setting its flag, its file key and its WorkerConfig
field, and the WorkerConfig crosses to the worker whole."""
from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Literal

import pytest
from pydantic import ValidationError

from poolgate.gateway.config.file import model_table, setting_error
from poolgate.shared.config.frozen import TracingConfig, TransportSecurity, WorkerConfig
from poolgate.shared.config.model_flags import add_model_arguments, settings_from_args, worker_config, worker_config_from_args
from poolgate.shared.config.model_settings import ModelSettings
from poolgate.shared.config.declare import declared, setting
from poolgate.shared.config.pooler_config import PoolerConfig


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
    for item in declared(ModelSettings):
        assert item.name in defaults, item.name
        assert defaults[item.name] == item.default_value(), item.name
        assert item.file_key in table.model_fields, item.name


def test_every_setting_reaches_the_worker_config(tmp_path):
    """WorkerConfig extends ModelSettings: a setting is the WorkerConfig field of its name, the flag's value."""
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args([str(tmp_path), "--tokenizer-threads", "5", "--embedding-cache-mb", "7", "--dtype",
                              "bfloat16", "--batch-policy", "fifo", "--verify-on-start", "--no-normalize"])
    cfg = worker_config_from_args(args)
    assert (cfg.tokenizer_threads, cfg.embedding_cache_mb, cfg.dtype, cfg.batch_policy) == (5, 7, "bfloat16", "fifo")
    assert (cfg.verify_on_start, cfg.pooler_config.use_activation, cfg.model) == (0.999, False, str(tmp_path))
    assert (cfg.normalize, cfg.served_model_name) == (None, str(tmp_path))  # folded; MODEL's name
    settings = settings_from_args(args)
    resolved = {item.name for item in declared(ModelSettings)
                if getattr(cfg, item.name) != getattr(settings, item.name)}
    assert resolved == {"served_model_name", "pooler_config", "normalize"}  # every other setting as given


FOLDED = ("pooling_type", "normalize")  # the aliases, folded into pooler_config before a WorkerConfig is made
SAMPLES = {"pooler_config": PoolerConfig(tok_pooling_type="STEP", dimensions=8, returned_token_ids=(1, 2)),
           "hf_overrides": {"matryoshka_dimensions": [64, 128]}}


def non_default(item):
    """A value of the setting ``item`` other than its default, within its declared bounds."""
    about = item.about
    if item.name in SAMPLES:
        return SAMPLES[item.name]
    if about.table is not None:
        return about.table({})
    if item.choices is not None:
        return next(c for c in item.choices if c != item.default)
    if item.kind is bool:
        return not item.default
    if item.kind is int:
        return (item.default if item.default is not None else about.ge or 0) + 1
    if item.kind is float:
        low = about.ge if about.ge is not None else about.gt or 0.0
        return (low + (about.le if about.le is not None else low + 2)) / 2
    return f"a {item.name}"


def test_the_worker_config_crosses_to_the_worker_whole():
    """to_wire, JSON, from_wire: every setting (each at a value not its default) and every process field."""
    settings = {item.name: non_default(item) for item in declared(ModelSettings) if item.name not in FOLDED}
    cfg = WorkerConfig(**settings, max_queued_tokens=64, device="1", cpu_affinity=(0, 2),
                       tracing=TracingConfig("http://c:4318/v1/traces", headers=(("k", "v"),), detailed=True),
                       security=TransportSecurity(token="t", tls_cert="c.pem", tls_key="k.pem"))
    at_default = [item.name for item in declared(ModelSettings) if item.name not in FOLDED
                  and getattr(cfg, item.name) == item.default_value()
                  and (item.about.table is None or item.name in SAMPLES)]
    assert at_default == []  # (a new table setting round-trips at its default, unless SAMPLES gives it a value)
    assert WorkerConfig.from_wire(json.loads(json.dumps(cfg.to_wire()))) == cfg
    plain = WorkerConfig(model="/m", served_model_name="m")
    assert WorkerConfig.from_wire(json.loads(json.dumps(plain.to_wire()))) == plain
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.dtype = "float32"  # type: ignore[misc]


@pytest.mark.parametrize("alias", [{"pooling_type": "CLS"}, {"normalize": False}])
def test_a_worker_config_refuses_an_alias_not_folded(alias):
    with pytest.raises(ValueError, match="folded into pooler_config"):
        WorkerConfig(model="/m", served_model_name="m", **alias)
    folded = worker_config(ModelSettings(model=None, **alias))
    assert (folded.pooling_type, folded.normalize) == (None, None) and folded.pooler_config != PoolerConfig()
