"""`poolgate worker` (a worker started alone) as a real process, behind a `poolgate serve --worker-url` gateway."""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from poolgate.gateway import serve
from poolgate.shared.config.frozen import WORKER_DRAIN_TIMEOUT_S
from poolgate.shared.config.model_flags import worker_config_from_args
from poolgate.workers import cli as worker_cli
from tests.processes import alive, children, free_port, health_status, wait_healthy

POOLGATE = [sys.executable, "-m", "poolgate.gateway.cli"]
FAKE = ["--runner-factory", "tests.workers.fake_factory:build"]


def _parse(add_arguments, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_serve_and_worker_read_the_model_flags_alike(tmp_path):
    flags = [str(tmp_path), "--served-model-name", "m", "--backend", "cpu", "--dtype", "float32",
             "--max-model-len", "128", "--max-batch-tokens", "4096", "--pooling-type", "mean",
             "--no-normalize", "--allow-pickle-weights", "--num-threads", "2"]
    (served,) = serve.config_from_args(_parse(serve.add_arguments, flags)).workers
    alone = worker_config_from_args(_parse(worker_cli.add_arguments, flags))
    assert served == alone
    assert (alone.pooler_config.seq_pooling_type, alone.pooler_config.use_activation, alone.max_batch_tokens) == ("MEAN", False, 4096)


def test_the_cli_imports_without_torch():
    code = "import sys, poolgate.gateway.cli, poolgate.workers.cli; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("args, code, message", [
    (["--help"], 0, "--listen"),
    (["--no-such-flag"], 2, "unrecognized arguments"),
    (["--listen", "http://x:1"], 2, "must start with unix: or tcp://"),
    (["/no/such/folder"], 2, "does not exist"),
    (["--listen", "tcp://127.0.0.1:1", "--runner-factory", "no_colon"], 2, "bad worker arguments"),
    (["--drain-timeout", "0"], 2, "must be a positive number"),
])
def test_usage(args, code, message):
    out = subprocess.run([*POOLGATE, "worker", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == code and message in out.stdout + out.stderr


def test_the_drain_timeout_reaches_the_worker(tmp_path, monkeypatch):
    from poolgate.workers import main as worker_main

    seen = []
    monkeypatch.setattr(worker_main, "run", lambda cfg, *args, **kwargs: seen.append(cfg.drain_timeout_s) or 0)
    assert worker_cli.main(_parse(worker_cli.add_arguments, [str(tmp_path), "--drain-timeout", "12.5"])) == 0
    worker_cli.main(_parse(worker_cli.add_arguments, [str(tmp_path)]))
    assert seen == [12.5, WORKER_DRAIN_TIMEOUT_S] and WORKER_DRAIN_TIMEOUT_S == 30


def test_worker_that_fails_to_load_exits_1(tmp_path):
    out = subprocess.run([*POOLGATE, "worker", str(tmp_path), "--listen", f"tcp://127.0.0.1:{free_port()}",
                          "--runner-factory", "tests.workers.fake_factory:fail"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cannot load" in out.stderr


def test_gateway_gives_up_on_a_worker_that_never_answers():
    out = subprocess.run([*POOLGATE, "serve", "--port", str(free_port()), "--startup-timeout", "1",
                          "--worker-url", f"tcp://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "could not start" in out.stderr and "Traceback" not in out.stderr


def _embed(url: str, model: str, texts: list[str]) -> dict:
    body = json.dumps({"model": model, "input": texts, "encoding_format": "float"}).encode()
    request = urllib.request.Request(f"{url}/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.status == 200
        return json.load(r)


def test_gateway_serves_through_a_worker_started_alone(tmp_path):
    worker_port, gateway_port = free_port(), free_port()
    url = f"http://127.0.0.1:{gateway_port}"
    gateway = subprocess.Popen([*POOLGATE, "serve", "--port", str(gateway_port),
                                "--worker-url", f"tcp://127.0.0.1:{worker_port}"],
                               stderr=subprocess.PIPE, text=True)
    worker = None
    try:
        while health_status(url) is None:  # the site binds before any worker is reached ...
            assert gateway.poll() is None
            time.sleep(0.05)
        assert health_status(url) == 503  # ... and says 503 until one is
        worker = subprocess.Popen([*POOLGATE, "worker", str(tmp_path), "--served-model-name", "alone",
                                   "--max-model-len", "16", "--listen", f"tcp://127.0.0.1:{worker_port}", *FAKE])
        wait_healthy(url, proc=gateway)
        body = _embed(url, "alone", ["one two three", "four"])
        assert [len(d["embedding"]) for d in body["data"]] == [8, 8]
        assert body["usage"]["prompt_tokens"] == 5 + 3
    finally:
        spawned = children(gateway.pid) + (children(worker.pid) if worker else [])
        gateway.send_signal(signal.SIGINT)
        gateway_code = gateway.wait(timeout=30)
        worker_outlived_gateway = worker is not None and worker.poll() is None
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            worker_code = worker.wait(timeout=30)
    assert gateway_code == 0 and worker_outlived_gateway and worker_code == 0
    assert "ready: serving alone at http://127.0.0.1" in gateway.stderr.read()
    assert not [p for p in spawned if alive(p)], "a child process was left behind"
