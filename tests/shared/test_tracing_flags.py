"""The tracing flags and OTEL_* variables, read once at the CLI edge into a TracingConfig."""
from __future__ import annotations

import argparse
import json
import os

import pytest

from poolgate.gateway import serve
from poolgate.shared.config.frozen import TracingConfig, WorkerConfig
from poolgate.shared.config.tracing_flags import add_tracing_arguments, parse_headers, tracing_config_from_args
from poolgate.workers import cli as worker_cli


def tracing(argv: list[str], env: dict[str, str] | None = None) -> TracingConfig | None:
    parser = argparse.ArgumentParser()
    add_tracing_arguments(parser)
    return tracing_config_from_args(parser.parse_args(argv), env or {})


def test_no_endpoint_no_tracing():
    assert tracing([]) is None
    assert tracing([], {"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_ENDPOINT": "  "}) is None


def test_the_flag_alone_gives_the_defaults():
    assert tracing(["--otlp-traces-endpoint", "http://c:4318/v1/traces"]) == TracingConfig(
        endpoint="http://c:4318/v1/traces", protocol="http/protobuf", service_name="poolgate",
        sampler="parentbased_always_on", sampler_arg=None, headers=(), detailed=False)


@pytest.mark.parametrize("env, endpoint", [
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}, "http://t:1/x"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318/"}, "http://b:4318/v1/traces"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http://b:4317"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:2"},
     "http://t:1/x"),
])
def test_endpoint_from_the_environment(env, endpoint):
    assert tracing([], env).endpoint == endpoint


def test_the_flag_wins_over_the_environment():
    cfg = tracing(["--otlp-traces-endpoint", "http://flag:1"], {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://env:2"})
    assert cfg.endpoint == "http://flag:1"


def test_the_other_variables():
    cfg = tracing(["--otlp-traces-endpoint", "http://c:4317", "--collect-detailed-traces"], {
        "OTEL_SERVICE_NAME": "embedder", "OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_HEADERS": "a=1",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Api-Key=s%3Dcret, x-team = ml ",
    })
    assert cfg == TracingConfig(endpoint="http://c:4317", protocol="grpc", service_name="embedder",
                                sampler="parentbased_traceidratio", sampler_arg=0.25,
                                headers=(("api-key", "s=cret"), ("x-team", "ml")), detailed=True)


def test_sampler_arg_is_kept_only_for_ratio_samplers():
    flag = ["--otlp-traces-endpoint", "http://c"]
    assert tracing(flag, {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "0.5"}).sampler_arg is None
    assert tracing(flag, {"OTEL_TRACES_SAMPLER": "traceidratio"}).sampler_arg is None  # the SDK's 1.0


@pytest.mark.parametrize("argv, env, message", [
    (["--collect-detailed-traces"], {}, "--collect-detailed-traces needs --otlp-traces-endpoint"),
    (["--otlp-traces-endpoint", "http://c"], {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "not supported"),
    (["--otlp-traces-endpoint", "http://c"], {"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER="),
    (["--otlp-traces-endpoint", "http://c"], {"OTEL_TRACES_SAMPLER": "traceidratio",
                                              "OTEL_TRACES_SAMPLER_ARG": "half"}, "between 0 and 1"),
    (["--otlp-traces-endpoint", "http://c"], {"OTEL_TRACES_SAMPLER": "traceidratio",
                                              "OTEL_TRACES_SAMPLER_ARG": "2"}, "between 0 and 1"),
    (["--otlp-traces-endpoint", "http://c"], {"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "not key=value"),
])
def test_bad_values_are_refused_with_the_variables_name(argv, env, message):
    with pytest.raises(ValueError, match=message):
        tracing(argv, env)


def test_headers_format():
    assert parse_headers("") == ()
    assert parse_headers("a=b=c,,B=%20x") == (("a", "b=c"), ("b", " x"))


def _parse(add_arguments, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_serve_puts_tracing_on_the_gateway_and_detailed_tracing_on_each_worker(tmp_path):
    flags = [str(tmp_path), "--workers", "2", "--otlp-traces-endpoint", "http://c:4318/v1/traces"]
    plain = serve.config_from_args(_parse(serve.add_arguments, flags), {})
    assert plain.tracing.endpoint == "http://c:4318/v1/traces" and not plain.tracing.detailed
    assert [w.tracing for w in plain.workers] == [None, None]
    detailed = serve.config_from_args(_parse(serve.add_arguments, [*flags, "--collect-detailed-traces"]), {})
    assert detailed.tracing.detailed and [w.tracing for w in detailed.workers] == [detailed.tracing] * 2
    assert serve.config_from_args(_parse(serve.add_arguments, [str(tmp_path)]), {}).tracing is None


def test_a_worker_started_alone_traces_only_with_detailed_traces(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    seen = []
    monkeypatch.setattr("poolgate.workers.main.run", lambda cfg, *a, **k: seen.append(cfg) or 0)
    endpoint = ["--otlp-traces-endpoint", "http://c:4318/v1/traces"]
    for extra in ([], ["--collect-detailed-traces"]):
        assert worker_cli.main(_parse(worker_cli.add_arguments, [str(tmp_path), *endpoint, *extra])) == 0
    assert seen[0].tracing is None and seen[1].tracing.detailed
    assert seen[1].tracing.endpoint == "http://c:4318/v1/traces"


def test_a_spawned_worker_gets_its_tracing_config_through_the_wire():
    cfg = WorkerConfig(model="/m", served_model_name="m", tracing=tracing(
        ["--otlp-traces-endpoint", "http://c", "--collect-detailed-traces"], {"OTEL_EXPORTER_OTLP_HEADERS": "k=v"}))
    assert WorkerConfig.from_wire(json.loads(json.dumps(cfg.to_wire()))) == cfg
