"""One declaration per gateway setting: ``GatewaySettings`` gives each serve setting its flag and its file key."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import pytest
from pydantic import ValidationError

from poolgate.gateway import serve
from poolgate.gateway.config.file import MODEL_FLAGS_OF_SERVE, FileSettings, setting_error, top_keys
from poolgate.gateway.config.settings import LIMITS, GatewaySettings
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.config.flags import add_flags
from poolgate.shared.config.declare import declared, setting


@dataclass(frozen=True)
class WithExample(GatewaySettings):
    """GatewaySettings plus one new setting, declared the one way a setting is declared."""

    example_workers: int = setting(1, ge=1, group=LIMITS, metavar="N", help="an example setting")


def test_a_new_gateway_setting_is_a_flag_and_a_file_key():
    parser = argparse.ArgumentParser()
    add_flags(parser, WithExample)
    assert parser.parse_args([]).example_workers == 1
    assert parser.parse_args(["--example-workers", "3"]).example_workers == 3
    (group,) = [g for g in parser._action_groups if g.title == LIMITS]
    assert "example_workers" in [a.dest for a in group._group_actions]  # listed with the limits in --help
    keys = top_keys(WithExample)
    assert getattr(keys.model_validate({"example_workers": 2}), "example_workers") == 2  # noqa: B009
    with pytest.raises(ValidationError) as info:
        keys.model_validate({"example_workers": 0})
    assert "must be >= 1, got 0" in str(setting_error(info.value, keys))
    assert "example_workers" not in FileSettings.model_fields  # the real file has only the real settings


def test_every_gateway_setting_is_a_serve_flag_and_a_file_key():
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    defaults = vars(parser.parse_args([]))
    for item in declared(GatewaySettings):
        assert defaults[item.name] == item.default_value(), item.name
        if item.about.models_key is not None:  # --workers, --worker-url: a key of every [[models]] table
            assert MODEL_FLAGS_OF_SERVE[item.name] == item.about.models_key
        else:
            assert item.file_key in FileSettings.model_fields, item.name


@pytest.mark.parametrize("flags", [("--port", "70000"), ("--startup-timeout", "0"), ("--max-queued-seconds", "-1"),
                                   ("--max-request-bytes", "0"), ("--transport", "udp"), ("--port", "x")])
def test_a_serve_flag_has_its_declared_checks(flags, capsys):
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(list(flags))
    assert flags[0] in capsys.readouterr().err


def test_the_serve_flags_defaults_are_the_gateway_configs():
    """GatewayConfig keeps defaults of its own (code and tests build it directly): they are the flags' defaults."""
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert replace(serve.config_from_args(parser.parse_args([]), {}), pools=()) == GatewayConfig()
