"""The gateway and CPU worker images, built here by docker/build-local.sh and run: the worker container serves the
bundled model to the gateway container, and a request from the host gets the vector sentence-transformers gives.

Slow (a first build takes minutes: debootstrap, buildah, pip inside the image). Skips, saying why, where the
machine cannot build or run containers (no buildah/podman/runc/debootstrap, not root, or a container that will not
start). Both containers use the host's network on loopback ports, so nothing leaves 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.processes import free_port, health_status

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docker" / "build-local.sh"
BASE = "localhost/debian-python"
ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "docker" / "local" / "containers.conf")}
TOOLS = ("buildah", "podman", "runc", "debootstrap")
TOKEN = uuid.uuid4().hex  # the worker token both containers share


def sh(*argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT)
    if check:
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def images() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"cannot build images here: {', '.join(missing)} not installed (apt-get install {' '.join(TOOLS)})")
    if os.geteuid() != 0:
        pytest.skip("cannot build images here: debootstrap and rootful podman need root")
    base = sh("bash", str(SCRIPT), "base", timeout=900, check=False)
    if base.returncode != 0:
        pytest.skip(f"cannot make the local base image: {(base.stdout + base.stderr)[-500:]}")
    probe = sh("podman", "run", "--rm", "--runtime", "runc", "--network", "host", BASE, "true", check=False)
    if probe.returncode != 0:
        pytest.skip(f"this machine cannot run containers: {probe.stderr.strip()[-500:]}")
    sh("bash", str(SCRIPT), "images", timeout=1800)


def run_container(name: str, image: str, *argv: str) -> None:
    sh("podman", "run", "-d", "--runtime", "runc", "--network", "host", "--name", name,
       "-e", "POOLGATE_WORKER_TOKEN=" + TOKEN, image, *argv)


def embed(url: str, texts: list[str]) -> np.ndarray:
    body = json.dumps({"input": texts}).encode()
    request = urllib.request.Request(f"{url}/v1/embeddings", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        data = json.load(response)["data"]
    return np.array([item["embedding"] for item in data], dtype=np.float32)


def wait_healthy(url: str, names: list[str], timeout_s: float = 300) -> float:
    """Seconds until ``url/health`` is 200; fails with the containers' logs if they stop first."""
    start, deadline = time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if health_status(url) == 200:
            return time.monotonic() - start
        states = sh("podman", "inspect", "--format", "{{.State.Status}}", *names, check=False).stdout.split()
        if any(s != "running" for s in states):
            break
        time.sleep(0.25)
    logs = "".join(sh("podman", "logs", n, check=False).stderr[-1500:] for n in names)
    raise AssertionError(f"{url}/health never answered 200: {logs}")


def test_the_worker_container_serves_the_gateway_container(images):
    from sentence_transformers import SentenceTransformer

    from poolgate.shared.config.models import bundled_model_path

    suffix = uuid.uuid4().hex[:8]
    worker, gateway = f"poolgate-test-worker-{suffix}", f"poolgate-test-gateway-{suffix}"
    worker_port, gateway_port = free_port(), free_port()
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        run_container(worker, "localhost/poolgate-cpu", "worker", "--listen", f"tcp://127.0.0.1:{worker_port}",
                      "--backend", "cpu", "--dtype", "float32")
        run_container(gateway, "localhost/poolgate-gateway", "serve", "--host", "127.0.0.1", "--port",
                      str(gateway_port), "--worker-url", f"tcp://127.0.0.1:{worker_port}")
        seconds = wait_healthy(url, [worker, gateway])
        print(f"containers started: /health 200 after {seconds:.1f} s", file=sys.stderr)
        texts = ["hello from the host", "poolgate serves pooling models from a container"]
        served = embed(url, texts)
    finally:
        sh("podman", "rm", "-f", "-t", "5", worker, gateway, check=False)
    assert served.shape == (2, 384)
    local = SentenceTransformer(str(bundled_model_path()), device="cpu").encode(texts, convert_to_numpy=True)
    cosine = (served * local).sum(1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(local, axis=1))
    assert cosine.min() > 0.9999, cosine


def podman_compose() -> list[str] | None:
    """A podman-compose of 1.1 or newer (Debian's 1.0.3 appends an override's command to the base one)."""
    for argv in ([sys.executable, "-m", "podman_compose"], ["podman-compose"]):
        try:
            out = subprocess.run([*argv, "version"], capture_output=True, text=True, timeout=60).stdout
        except OSError:
            continue
        version = next((line.split()[-1] for line in out.splitlines() if line.startswith("podman-compose")), "")
        if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) >= (1, 1):
            return argv
    return None


def test_compose_runs_the_gateway_and_the_worker(images):
    argv = podman_compose()
    if argv is None:
        pytest.skip("no podman-compose 1.1+ (pip install podman-compose; Debian's 1.0.3 mis-merges overrides)")
    gateway_port, worker_port = free_port(), free_port()
    env = {"POOLGATE_WORKER_TOKEN": TOKEN, "POOLGATE_PORT": str(gateway_port), "POOLGATE_WORKER_PORT": str(worker_port)}
    ENV.update(env)
    files = ["-f", "docker/compose.yaml", "-f", "docker/compose.local.yaml"]
    try:
        sh(*argv, *files, "up", "-d", "--no-deps", "--no-build", "gateway", "worker", timeout=300)
        url = f"http://127.0.0.1:{gateway_port}"
        wait_healthy(url, ["poolgate_gateway_1", "poolgate_worker_1"])
        vectors = embed(url, ["hello from compose"])
    finally:
        sh(*argv, *files, "down", "-t", "5", timeout=300, check=False)
        for key in env:
            ENV.pop(key)
    assert vectors.shape == (1, 384) and abs(float(np.linalg.norm(vectors[0])) - 1) < 1e-3
