"""What the Kubernetes manifests (kustomize overlays and the Helm chart alike) must agree with: the images docker/
builds, the CLI's flags, the gateway's routes and the metrics (and labels) it really exports, and drain timing."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from poolgate.gateway.app import make_app
from poolgate.gateway.cli import build_parser
from poolgate.gateway.pools.discovery import DEFAULT_INTERVAL_S
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.gateway.telemetry.metrics import GatewayMetrics
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.telemetry import names as telemetry
from tests.fakes import FakeWorkerClient, fake_model

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
K8S = DOCKER / "k8s"
KUBECTL = ROOT / ".cache" / "bin" / "kubectl"
BACKENDS = ("cpu", "cuda", "rocm", "xpu")
DEVICE_RESOURCE = {"cpu": None, "cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu", "xpu": "gpu.intel.com/i915"}
TOKEN_SECRET = "poolgate-worker-token"
DNS_TTL_S = 5  # CoreDNS's TTL for a headless Service's records (its kubernetes plugin's default)
SELECTOR = re.compile(r"(poolgate_[a-z_]+)\s*(?:\{([^}]*)\})?")
MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"([^"]*)"')


def no_tool(tool: str, reason: str, how: str):
    """Skip where a developer lacks ``tool``; in CI (.ci/run installs it) fail, so nothing goes unchecked."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; .ci/run unpacks {tool} into {how}")
    pytest.skip(f"{reason}; run .ci/run (or see its kubectl/helm step) to render the manifests")


def no_kubectl(reason: str):
    no_tool("kubectl", reason, str(KUBECTL))


def kubectl_path() -> str:
    kubectl = str(KUBECTL) if os.access(KUBECTL, os.X_OK) else shutil.which("kubectl")
    if kubectl is None:
        no_kubectl("kubectl is not installed")
    try:
        version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    except OSError as exc:  # e.g. the x86-64 binary on another CPU
        no_kubectl(f"{kubectl} does not run: {exc}")
    major = re.search(r"Kustomize Version: v(\d+)", version)
    if major is None or int(major.group(1)) < 4:
        no_kubectl(f"{kubectl}'s kustomize is older than v4 (no components/labels): {version.strip()!r}")
    return kubectl


def render(overlay: str) -> list[dict]:
    """The overlay as ``kubectl kustomize`` renders it."""
    kubectl = kubectl_path()
    out = subprocess.run([kubectl, "kustomize", str(K8S / overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def dockerfile_images() -> dict[str, Path]:
    """Image name -> Dockerfile: ``poolgate-<suffix>`` is built from ``docker/Dockerfile.<suffix>``."""
    return {f"poolgate-{p.suffix[1:]}": p for p in DOCKER.glob("Dockerfile.*")}


def cli_args(argv: list[str]):
    """Parse a container's argv after the ``poolgate`` entry point exactly as the CLI would (SystemExit if not)."""
    return build_parser().parse_args([str(a) for a in argv])


def routes() -> set[str]:
    app = make_app(GatewayConfig(), Router())
    GatewayMetrics(Router()).add_route(app)
    return {r.resource.canonical for r in app.router.routes() if r.method == "GET"}


def exported_metrics() -> set[str]:
    return {
        v
        for k, v in vars(telemetry).items()
        if k.isupper() and isinstance(v, str) and v.startswith(telemetry.PREFIX + "_")
    }


def exported_series() -> dict[str, set[str]]:
    """Each sample name a gateway's /metrics serves for one pool of one worker -> its label names (a real scrape)."""
    info = dataclasses.replace(fake_model().info, backend="cpu")
    worker = FakeWorkerClient(info, address="tcp://10.0.0.7:9100")
    worker.health_answer = {"ready": True, "queued_tokens": 0, "pipeline": {"tokens_per_s": 100.0}}
    text = asyncio.run(GatewayMetrics(Router([WorkerPool(info, [worker])])).render()).decode()
    return {s.name: set(s.labels) for family in text_string_to_metric_families(text) for s in family.samples}


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def check_query(query: str, backend: str, series: dict[str, set[str]]) -> None:
    """A PromQL query names only series the gateway exports, with their own labels, and selects ``backend``."""
    selectors = SELECTOR.findall(query)
    assert selectors, query
    for metric, matchers in selectors:
        assert metric in series, f"{metric} is not exported: {query}"
        found = dict(MATCHER.findall(matchers))
        assert set(found) <= series[metric], f"{metric} has no label {set(found) - series[metric]}: {query}"
        assert found.get(telemetry.BACKEND) == backend, query


def check_scaled_object(scaled: dict, deployment: str, backend: str, series: dict[str, set[str]]) -> None:
    """KEDA's ScaledObject (keda.sh/v1alpha1) scales ``deployment`` on Prometheus queries of our metrics."""
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == deployment
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]  # not 0: an empty pool answers 503 before admission
    assert spec["triggers"]
    for trigger in spec["triggers"]:
        meta = trigger["metadata"]
        assert trigger["type"] == "prometheus" and trigger.get("metricType", "AverageValue") == "Value"
        assert "metricName" not in meta  # removed in KEDA 2.12
        assert meta["serverAddress"].startswith(("http://", "https://"))
        for key in ("threshold", "activationThreshold"):
            assert isinstance(meta[key], str) and float(meta[key]) > 0, key  # KEDA wants strings
        check_query(meta["query"], backend, series)
    queries = " ".join(t["metadata"]["query"] for t in spec["triggers"])
    assert telemetry.POOL_QUEUED_SECONDS in queries  # the seconds-behind signal is one of them


def check_hpa(hpa: dict, deployment: str, backend: str, series: dict[str, set[str]]) -> None:
    """A plain autoscaling/v2 HPA scales ``deployment`` on a Pods or External metric the gateway exports."""
    spec = hpa["spec"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment}
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
    assert spec["metrics"]
    for metric in spec["metrics"]:
        assert metric["type"] in ("Pods", "External")
        source = metric[metric["type"].lower()]
        name, labels = source["metric"]["name"], source["metric"].get("selector", {}).get("matchLabels", {})
        assert name in series and name in exported_metrics(), name
        assert set(labels) <= series[name] and labels[telemetry.BACKEND] == backend, labels
        target = source["target"]
        assert isinstance(target.get("value", target.get("averageValue")), str)  # quantities are strings
    assert spec["metrics"][0]["external"]["metric"]["name"] == telemetry.POOL_QUEUED_SECONDS


def one_autoscaler_each(docs: list[dict]) -> None:
    """Every worker Deployment has exactly one autoscaler (a ScaledObject or an HPA, never both); nothing else."""
    scaled = [
        d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")
    ]
    workers = [n for n in by_kind(docs, "Deployment") if n.startswith("poolgate-worker-")]
    assert sorted(scaled) == sorted(workers), scaled


def prestop_sleep(container: dict) -> float:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, command
    return float(command[1])


def check_drain(deployment: dict, config_files: dict[str, str] | None = None) -> None:
    """Scale-in never kills mid-batch: the grace period covers the preStop sleep plus the process's drain timeout
    (the flag, or the gateway's config file's key); a worker's sleep outlasts DNS and the gateways' discovery."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = cli_args(container["args"])
    drain = args.drain_timeout
    if getattr(args, "config", None):  # a gateway configured by file: its drain_timeout key wins over the default
        drain = tomllib.loads((config_files or {})[args.config.rpartition("/")[2]]).get("drain_timeout", drain)
    sleep = prestop_sleep(container)
    assert pod["terminationGracePeriodSeconds"] >= sleep + drain, deployment["metadata"]["name"]
    if args.command == "worker":
        assert sleep > DNS_TTL_S + DEFAULT_INTERVAL_S  # every gateway has dropped the pod before its SIGTERM
