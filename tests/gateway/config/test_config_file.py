"""``serve --config FILE``: a good file, the CLI as a one-entry config, and every error kind with its line."""
from __future__ import annotations

import argparse
import textwrap

import pytest

from poolgate.gateway import serve
from poolgate.gateway.config.file import ConfigError, config_from_toml, load_config
from poolgate.gateway.config.given import parse_noting_given
from poolgate.gateway.config.toml_lines import key_lines, line_of
from poolgate.shared.config.models import DEFAULT_MODEL_NAME, bundled_model_path
from poolgate.shared.config.pooler_config import PoolerConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    serve.add_arguments(p)
    return p


def load(text: str, tmp_path, name: str = "serve.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return load_config(str(path), parser(), {})


def error(text: str, tmp_path) -> str:
    with pytest.raises(ConfigError) as info:
        load(text, tmp_path)
    return str(info.value)


GOOD = """\
host = "0.0.0.0"
port = 9000
api_key = "sk-test"
transport = "tcp"
request_timeout = 30
max_in_flight_per_worker = 16
model_roots = ["models"]

[[models]]
name = "minilm"
backend = "cuda"
devices = [0, 1]
dtype = "float16"
max_batch_tokens = 4096
max_in_flight_per_worker = 64
[models.pooler_config]
pooling_type = "MEAN"
use_activation = false

[[models]]
name = "minilm"          # the CPU overflow pool of the same model
backend = "cpu"
replicas = 2
[[models.remote]]
url = "tcp://gpu-host-3:9100"
[[models.remote]]
url = "dns+tcp://poolgate-workers.default.svc:9100"

[[models]]
name = "tiny"
model = "models/tiny"
runner = "pooling"
convert = "embed"
hf_overrides = { matryoshka_dimensions = [4, 8] }
allow_pickle_weights = true
normalize = false
"""


def test_a_good_file(tmp_path):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    config = load(GOOD, tmp_path)
    assert (config.host, config.port, config.api_key, config.transport) == ("0.0.0.0", 9000, "sk-test", "tcp")
    assert config.request_timeout_s == 30 and config.max_in_flight_per_worker == 16
    assert config.model_roots == (str((tmp_path / "models").resolve()),)
    cuda, cpu, tiny = config.pools
    assert (cuda.model, cuda.backend, cuda.devices, len(cuda.workers)) == ("minilm", "cuda", ("0", "1"), 2)
    assert cuda.max_in_flight_per_worker == 64 and cpu.max_in_flight_per_worker is None
    w = cuda.workers[0]
    assert w.model == str(bundled_model_path()) and w.served_model_name == "minilm"
    assert (w.backend, w.dtype, w.max_batch_tokens) == ("cuda", "float16", 4096)
    assert w.pooler_config == PoolerConfig(pooling_type="MEAN", use_activation=False)
    assert (cpu.backend, len(cpu.workers), cpu.devices) == ("cpu", 2, ())
    assert cpu.remotes == ("tcp://gpu-host-3:9100", "dns+tcp://poolgate-workers.default.svc:9100")
    t = tiny.workers[0]
    assert t.model == str(tmp_path / "models" / "tiny") and t.served_model_name == "tiny"
    assert (t.runner, t.convert, t.allow_pickle_weights) == ("pooling", "embed", True)
    assert t.hf_overrides == {"matryoshka_dimensions": [4, 8]} and t.pooler_config.use_activation is False
    assert config.workers == (*cuda.workers, *cpu.workers, *tiny.workers)


def test_the_command_line_is_a_one_entry_config(tmp_path):
    (tmp_path / "m").mkdir()
    flags = [str(tmp_path / "m"), "--served-model-name", "x", "--workers", "2", "--backend", "cpu",
             "--max-batch-tokens", "512", "--pooling-type", "cls", "--port", "8100"]
    from_flags = serve.config_from_args(parser().parse_args(flags), {})
    from_file = load(f"""\
        port = 8100
        [[models]]
        model = "{tmp_path / 'm'}"
        name = "x"
        replicas = 2
        backend = "cpu"
        max_batch_tokens = 512
        pooling_type = "cls"
        """, tmp_path)
    assert from_flags == from_file


def test_defaults_a_bare_model_and_remote_only_entries(tmp_path):
    config = load("""\
        [[models]]
        [[models]]
        name = "far"
        [[models.remote]]
        url = "unix:/tmp/w.sock"
        """, tmp_path)
    local, far = config.pools
    assert local.model == DEFAULT_MODEL_NAME and len(local.workers) == 1 and config.port == 8000
    assert (far.model, far.workers, far.remotes) == ("far", (), ("unix:/tmp/w.sock",))


def test_api_key_file(tmp_path):
    (tmp_path / "key").write_text("sk-from-file\n")
    assert load('api_key_file = "key"\n[[models]]\n', tmp_path).api_key == "sk-from-file"
    assert "api_key_file: give api_key or api_key_file" in error(
        'api_key = "a"\napi_key_file = "key"\n[[models]]\n', tmp_path)
    assert "serve.toml:1: api_key_file: cannot read" in error('api_key_file = "nope"\n[[models]]\n', tmp_path)


@pytest.mark.parametrize("text, where, message", [
    ("port = 70000\n[[models]]\n", "serve.toml:1: port", "must be <= 65535, got 70000"),
    ('port = "80"\n[[models]]\n', "serve.toml:1: port", "must be an integer"),
    ("colour = 1\n[[models]]\n", "serve.toml:1: colour", "unknown key"),
    ("transport = 'udp'\n[[models]]\n", "serve.toml:1: transport", "must be one of 'unix' or 'tcp', got 'udp'"),
    ("workers = 2\n[[models]]\n", "serve.toml:1: workers", "unknown key"),
    ("request_timeout = -1\n[[models]]\n", "serve.toml:1: request_timeout", "must be > 0"),
    ("auto_truncate = 1\n[[models]]\n", "serve.toml:1: auto_truncate", "true or false"),
    ('model_roots = "x"\n[[models]]\n', "serve.toml:1: model_roots", "must be a list"),
    ('model_roots = ["missing"]\n[[models]]\n', "serve.toml:1: model_roots", "is not a folder"),
    ('port = 1\n', "serve.toml", "at least one [[models]] table"),
    ('models = 3\n', "serve.toml:1: models", "at least one [[models]] table"),
    ('[[models]]\n\n[[models]]\nreplicas = -1\n', "serve.toml:4: models[1].replicas", "must be >= 0"),
    ('[[models]]\nreplicas = 1.5\n', "serve.toml:2: models[0].replicas", "must be an integer"),
    ('[[models]]\nbackend = "tpu"\n', "serve.toml:2: models[0].backend", "must be one of 'auto', 'cpu'"),
    ('[[models]]\ndtype = "int4"\n', "serve.toml:2: models[0].dtype", "'float16'"),
    ('[[models]]\nmax_batch_tokens = 0\n', "serve.toml:2: models[0].max_batch_tokens", "must be >= 1, got 0"),
    ('[[models]]\nserved_model_name = "x"\n', "serve.toml:2: models[0].served_model_name", "unknown key"),
    ('[[models]]\nmodel = "nowhere"\n', "serve.toml:2: models[0].model", "does not exist"),
    ('[[models]]\n[models.pooler_config]\npooling_type = "NOPE"\n', "serve.toml:2: models[0].pooler_config", ""),
    ('[[models]]\npooler_config = {colour = 1}\n', "serve.toml:2: models[0].pooler_config", "colour"),
    ('[[models]]\nhf_overrides = [1]\n', "serve.toml:2: models[0].hf_overrides", "must be a table"),
    ('[[models]]\ndevices = [0, 0]\n', "serve.toml:2: models[0].devices", "twice"),
    ('[[models]]\ndevices = [true]\n', "serve.toml:2: models[0].devices", "must be a list"),
    ('[[models]]\ndevices = [0, 1]\nreplicas = 3\n', "serve.toml:1: models[0]", "2 devices are listed"),
    ('[[models]]\nreplicas = 0\n', "serve.toml:1: models[0]", "needs local replicas"),
    ('[[models]]\n[[models.remote]]\nport = 1\n', "serve.toml:3: models[0].remote[0].port", "unknown key"),
    ('[[models]]\n[[models.remote]]\n', "serve.toml:2: models[0].remote[0].url", "is required"),
    ('[[models]]\n[[models.remote]]\nurl = "http://x"\n', "serve.toml:3: models[0].remote[0].url",
     "must be tcp://host:port"),
    ('[[models]]\nremote = "tcp://a:1"\n', "serve.toml:2: models[0].remote", "must be a list"),
    ('[[models]]\n[[models.remote]]\nurl = "dns+tcp://svc"\n', "serve.toml:3: models[0].remote[0].url",
     "dns+tcp://name:port"),
    ('[[models]]\nname = "a"\n\n[[models]]\nname = "a"\n', "serve.toml:4: models[1]", "two pools on backend"),
    ('[[models]]\npooling_type = "cls"\npooler_config = {pooling_type = "MEAN"}\n', "serve.toml:1: models[0]",
     "both given"),
    ("port = \n", "serve.toml: not valid TOML", "line 1"),
    ("collect_detailed_traces = true\n[[models]]\n", "serve.toml:", "needs --otlp-traces-endpoint"),
    ("gateway_processes = 0\n[[models]]\n", "serve.toml:1: gateway_processes", "must be >= 1"),
    ('gateway_processes = 2\ntransport = "tcp"\n[[models]]\n', "serve.toml:1: gateway_processes",
     "needs transport = unix for local workers"),
    ('gateway_processes = 2\nmodel_roots = ["."]\n[[models]]\n', "serve.toml:1: gateway_processes",
     "cannot go with model_roots"),
])
def test_every_error_names_the_file_line_and_key(tmp_path, text, where, message):
    got = error(text, tmp_path)
    assert got.startswith(str(tmp_path / where)), got
    assert message in got


def test_key_lines_survive_multiline_values_comments_and_inline_tables():
    text = textwrap.dedent('''\
        # a comment with key = "value"
        host = "x"
        note = """
        port = 1
        """

        [[models]]   # first
        name = "a"
        devices = [
          0,
          1,
        ]
        pooler_config = { pooling_type = "MEAN", dimensions = 4 }

        [[models]]
        [models.hf_overrides]
        a.b = 1
        [[models.remote]]
        url = "tcp://h:1"
        ''')
    found = key_lines(text)

    def line(path):
        return line_of(found, path)
    assert line(("host",)) == 2 and line(("note",)) == 3 and line(("port",)) is None
    assert line(("models", 0)) == 7 and line(("models", 0, "name")) == 8
    assert line(("models", 0, "devices")) == 9 and line(("models", 0, "devices", 1)) == 9
    assert line(("models", 0, "pooler_config", "dimensions")) == 13
    assert line(("models", 1)) == 15 and line(("models", 1, "hf_overrides")) == 16
    assert line(("models", 1, "hf_overrides", "a", "b")) == 17
    assert line(("models", 1, "remote", 0, "url")) == 19
    assert line(("models", 1, "nope")) == 15  # a missing key: its table's line


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(str(tmp_path / "missing.toml"), parser(), {})
    assert serve.main(parser().parse_args(["--config", str(tmp_path / "missing.toml"), "--port", "9"])) == 2


def test_text_without_a_file(tmp_path):
    config = config_from_toml("[[models]]\nname = 'a'\n", str(tmp_path / "inline.toml"), parser(), {})
    assert config.pools[0].model == "a"


def test_worker_transport_security_keys(tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    config = load('worker_token_file = "token"\nworker_tls = true\nworker_tls_server_name = "w"\n[[models]]\n',
                  tmp_path)
    sec = config.worker_security
    assert (sec.token, sec.tls, sec.tls_server_name) == ("s3cret", True, "w")
    assert "serve.toml:1: worker_token_file: cannot read" in error('worker_token_file = "nope"\n[[models]]\n',
                                                                    tmp_path)
    assert "needs --worker-tls" in error('worker_tls_ca = "ca.pem"\n[[models]]\n', tmp_path)


def test_a_bad_worker_url_on_the_command_line_is_refused():
    with pytest.raises(ValueError, match="a worker URL must be"):
        serve.config_from_args(parser().parse_args(["--worker-url", "http://w:1"]), {})
    config = serve.config_from_args(parser().parse_args(["--worker-url", "dns+tcp://w.svc:9100"]), {})
    assert config.pools[0].remotes == ("dns+tcp://w.svc:9100",) and config.pools[0].model is None


def test_gateway_processes_with_remote_workers_over_tcp_and_vllms_name_for_it():
    args = parser().parse_args(["--api-server-count", "3", "--transport", "tcp", "--worker-url", "tcp://w:1"])
    assert serve.config_from_args(args, {}).gateway_processes == 3  # no local worker: nothing to lose
    with pytest.raises(ValueError, match="^gateway_processes = 2 needs transport = unix"):
        serve.config_from_args(parser().parse_args(["--gateway-processes", "2", "--transport", "tcp"]), {})


def test_the_top_level_file_keys_are_the_serve_flags(tmp_path):
    """The gateway and model settings are declared once (tests/gateway/config/test_gateway_settings.py,
    tests/shared/test_model_settings.py); the tracing and worker security flags are still declared twice (in
    shared.config.tracing_flags / shared.config.security_flags and FileSettings): this keeps them equal."""
    from poolgate.gateway.config.file import ALIASES, MODEL_DEFAULTS, FileSettings

    serve_dests = set(vars(parser().parse_args([]))) - {"config", "log_level", "workers", "worker_url"}
    top = {ALIASES.get(key, key) for key in FileSettings.model_fields} - {"models"}
    assert top == serve_dests - set(MODEL_DEFAULTS), "a serve flag needs its key in config.file.FileSettings"


def with_flags(text: str, tmp_path, *flags: str):
    path = tmp_path / "serve.toml"
    path.write_text(textwrap.dedent(text))
    return serve.config_from_args(parse_noting_given(serve.add_arguments, ["--config", str(path), *flags]), {})


TWO_MODELS = """\
    host = "0.0.0.0"
    port = 9000
    api_key_file = "key"
    request_timeout = 30
    [[models]]
    name = "a"
    dtype = "float32"
    [[models]]
    name = "b"
    backend = "cpu"
    replicas = 2
    """


def test_flags_given_beside_the_file_override_its_values(tmp_path):
    (tmp_path / "key").write_text("from-file\n")
    plain = with_flags(TWO_MODELS, tmp_path)
    assert (plain.host, plain.port, plain.api_key, plain.request_timeout_s) == ("0.0.0.0", 9000, "from-file", 30)
    assert len(plain.pools[1].workers) == 2
    config = with_flags(TWO_MODELS, tmp_path, "--port", "8000", "--api-key", "from-flag", "--dtype", "bfloat16",
                        "--workers", "1", "--auto-truncate")
    assert config.port == 8000  # given, though it is the flag's default
    assert config.api_key == "from-flag"  # --api-key replaces the file's api_key_file
    assert (config.host, config.request_timeout_s, config.auto_truncate) == ("0.0.0.0", 30, True)
    a, b = config.pools
    assert {w.dtype for w in (*a.workers, *b.workers)} == {"bfloat16"}  # a model flag: every [[models]] table
    assert (len(a.workers), len(b.workers), b.backend) == (1, 1, "cpu")  # --workers: every table's replicas
    assert with_flags(TWO_MODELS, tmp_path, "--no-metrics").metrics is False


def test_a_flag_does_not_hide_a_bad_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        with_flags('port = 1\n[[models]]\n\nreplicas = "two"\n', tmp_path, "--port", "9")
    assert str(info.value) == f"{tmp_path / 'serve.toml'}:4: models[0].replicas: must be an integer, got 'two'"


def test_tokenizer_threads_size_the_gateways_pool_from_a_flag_or_the_file(tmp_path):
    from poolgate.gateway.tokenizing import configured_threads, pool_threads

    default = serve.config_from_args(parser().parse_args([]), {})
    assert default.workers[0].tokenizer_threads is None and configured_threads(default) == pool_threads()
    assert (pool_threads(1), pool_threads(6), pool_threads(64)) == (2, 6, 8)  # one per CPU, 2 to 8
    flagged = serve.config_from_args(parser().parse_args(["--tokenizer-threads", "4"]), {})
    assert flagged.workers[0].tokenizer_threads == 4 and configured_threads(flagged) == 4
    assert load("[[models]]\ntokenizer_threads = 3\n", tmp_path).workers[0].tokenizer_threads == 3
    assert "models[0].tokenizer_threads: must be >= 1" in error("[[models]]\ntokenizer_threads = 0\n", tmp_path)


def test_replicas_per_device_from_the_command_line_and_the_file(tmp_path):
    (tmp_path / "m").mkdir()
    flags = [str(tmp_path / "m"), "--backend", "cuda", "--replicas-per-device", "2"]
    pool = serve.config_from_args(parser().parse_args(flags), {}).pools[0]
    assert pool.devices == ("0", "0") and [w.device for w in pool.workers] == ["0", "0"]
    assert all(w.replicas_per_device == 2 for w in pool.workers)  # each worker sizes its budget by its share
    file = load(f"""\
        [[models]]
        model = "{tmp_path / 'm'}"
        backend = "cuda"
        devices = [1, 2]
        replicas_per_device = 2
        """, tmp_path).pools[0]
    assert file.devices == ("1", "1", "2", "2")
    wrong = error(f"""\
        [[models]]
        model = "{tmp_path / 'm'}"
        backend = "cuda"
        devices = [1, 2]
        replicas = 2
        replicas_per_device = 2
        """, tmp_path)
    assert "2 devices are listed with 2 worker(s) per device" in wrong
