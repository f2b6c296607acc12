"""``gateway.config.given``: the flags a command line gave, told apart from defaults with argparse's public API."""
from __future__ import annotations

from poolgate.gateway import cli, serve
from poolgate.gateway.config.given import given, parse_noting_given


def test_a_flag_given_with_its_default_value_is_given():
    args = parse_noting_given(serve.add_arguments, ["--port", "8000", "--workers", "1", "--backend", "auto"])
    assert given(args) == {"port": 8000, "workers": 1, "backend": "auto"}


def test_every_kind_of_flag_is_noted_and_defaults_are_not():
    args = parse_noting_given(serve.add_arguments, [
        "some/model", "--no-metrics", "--reuse-port", "--model-root", "a", "--model-root", "b", "--verify-on-start",
        "--pooler-config", '{"dimensions": 8}'])
    noted = given(args)
    assert noted.keys() == {"model", "metrics", "reuse_port", "model_root", "verify_on_start", "pooler_config"}
    assert (noted["metrics"], noted["model_root"], noted["verify_on_start"]) == (False, ["a", "b"], 0.999)
    assert (args.port, args.metrics, args.model_root) == (8000, False, ["a", "b"])  # the parse itself is as usual
    assert given(parse_noting_given(serve.add_arguments, [])) == {}


def test_the_command_line_notes_what_it_gave(monkeypatch):
    seen = {}
    monkeypatch.setattr(serve, "main", lambda args: seen.update(given(args)) or 0)
    assert cli.main(["serve", "--port", "8000", "--dtype", "float32"]) == 0
    assert seen == {"port": 8000, "dtype": "float32"}
