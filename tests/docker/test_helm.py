"""docker/helm/poolgate: ``helm lint`` and ``helm template`` with the default values, each backend and each autoscaler.
The rendered objects pass the checks the kustomize overlays pass (images built here, flags the CLI accepts, probe
paths the gateway routes, one autoscaler per worker Deployment on metrics it exports, drain within the grace
period) and, for the release named "poolgate", equal what the matching overlay renders. helm is .cache/bin/helm,
which .ci/run unpacks from the same PyPI wheel as kubectl, else the one on PATH; in CI a missing helm fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib

import pytest
import yaml

from poolgate.gateway import serve
from poolgate.gateway.config.given import parse_noting_given
from tests.docker.checks import (
    BACKENDS,
    DOCKER,
    ROOT,
    by_kind,
    check_drain,
    check_hpa,
    check_scaled_object,
    cli_args,
    dockerfile_images,
    exported_series,
    no_tool,
    one_autoscaler_each,
    render,
    routes,
)

HELM = ROOT / ".cache" / "bin" / "helm"
CHART = DOCKER / "helm" / "poolgate"
RELEASE = "poolgate"  # the overlays' names are the chart's for this release name
HELM_ONLY_LABELS = (
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
    "app.kubernetes.io/part-of",
)


def helm_path() -> str:
    helm = str(HELM) if os.access(HELM, os.X_OK) else shutil.which("helm")
    if helm is None:
        no_tool("helm", "helm is not installed", str(HELM))
    try:
        version = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, timeout=60).stdout
    except OSError as exc:  # e.g. the x86-64 binary on another CPU
        no_tool("helm", f"{helm} does not run: {exc}", str(HELM))
    if not version.startswith("v3."):
        no_tool("helm", f"{helm} is not helm 3: {version.strip()!r}", str(HELM))
    return helm


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_path(), *args], capture_output=True, text=True, timeout=120)


def template(*sets: str) -> list[dict]:
    """The chart rendered for release "poolgate" with ``sets`` (KEY=VALUE each)."""
    out = helm("template", RELEASE, str(CHART), *(a for s in sets for a in ("--set", s)))
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def only(*backends: str) -> list[str]:
    """Values that enable exactly ``backends``."""
    return [f"workers.backends.{b}.enabled={'true' if b in backends else 'false'}" for b in BACKENDS]


def comparable(docs: list[dict]) -> dict[tuple[str, str], dict]:
    """(kind, name) -> what must match between chart and overlay: specs (a ConfigMap's TOML, parsed), without the
    labels only the chart adds (release, chart) and the names' hashes only kustomize adds."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in HELM_ONLY_LABELS and k != "annotations"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return re.sub(r"^(poolgate-gateway-config)-[a-z0-9]{10}$", r"\1", value) if isinstance(value, str) else value

    out = {}
    for doc in docs:
        name = strip(doc["metadata"]["name"])
        if doc["kind"] == "ConfigMap":
            out[doc["kind"], name] = {k: tomllib.loads(v) for k, v in doc["data"].items()}
        else:
            out[doc["kind"], name] = strip(doc["spec"])
    return out


def check_objects(docs: list[dict]) -> None:
    """What every rendering must hold (the overlays' checks)."""
    series = exported_series()
    files = {k: v for m in by_kind(docs, "ConfigMap").values() for k, v in m["data"].items()}
    one_autoscaler_each(docs)
    for name, deployment in by_kind(docs, "Deployment").items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"].split(":")[0] in dockerfile_images()
        args = cli_args(container["args"])
        assert args.command == ("serve" if name == f"{RELEASE}-gateway" else "worker")
        for probe in ("readinessProbe", "livenessProbe"):
            if "httpGet" in container[probe]:
                assert container[probe]["httpGet"]["path"] in routes()
        check_drain(deployment, files)
    for backend in BACKENDS:
        worker = f"{RELEASE}-worker-{backend}"
        if worker in by_kind(docs, "HorizontalPodAutoscaler"):
            check_hpa(by_kind(docs, "HorizontalPodAutoscaler")[worker], worker, backend, series)
        if worker in by_kind(docs, "ScaledObject"):
            check_scaled_object(by_kind(docs, "ScaledObject")[worker], worker, backend, series)


@pytest.mark.parametrize("sets", [[], ["autoscaling.kind=keda", "gateway.grpcPort=50051", *only(*BACKENDS)]])
def test_the_chart_lints(sets):
    out = helm("lint", "--strict", str(CHART), *(a for s in sets for a in ("--set", s)))
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_defaults_render_the_cpu_overlay():
    docs = template()
    check_objects(docs)
    assert comparable(docs) == comparable(render("cpu"))


@pytest.mark.parametrize("kind", ["hpa", "keda"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_and_autoscaler_renders_its_overlay(backend, kind):
    docs = template(*only(backend), f"autoscaling.kind={kind}")
    check_objects(docs)
    assert comparable(docs) == comparable(render(backend if kind == "hpa" else f"{backend}-keda"))


def test_no_autoscaler_when_none_is_chosen():
    docs = template("autoscaling.kind=none")
    assert not by_kind(docs, "HorizontalPodAutoscaler") and not by_kind(docs, "ScaledObject")


@pytest.mark.parametrize(
    "sets, message",
    [
        (["autoscaling.kind=both"], "autoscaling.kind must be hpa, keda or none"),
        (
            [
                *only(),
            ],
            "enable at least one of workers.backends",
        ),
        (["workers.order={cuda,rocm,xpu,cpu,tpu}"], 'workers.order names "tpu"'),
        ([*only("cuda", "cpu"), "workers.order={cpu}"], 'workers.order must list the enabled backend "cuda"'),
    ],
)
def test_values_the_chart_cannot_honour_are_refused(sets, message):
    out = helm("template", RELEASE, str(CHART), *(a for s in sets for a in ("--set", s)))
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_the_order_of_the_pools_is_the_values():
    for order, urls in (("{cuda,cpu}", ["cuda", "cpu"]), ("{cpu,cuda}", ["cpu", "cuda"]), ("{cpu}", ["cpu"])):
        docs = template(*only(*urls), f"workers.order={order}")
        text = "".join(m["data"]["poolgate.toml"] for m in by_kind(docs, "ConfigMap").values())
        gateway = by_kind(docs, "Deployment")[f"{RELEASE}-gateway"]["spec"]["template"]["spec"]["containers"][0]
        if len(urls) > 1:
            assert [m["backend"] for m in tomllib.loads(text)["models"]] == urls
        else:
            assert cli_args(gateway["args"]).worker_url == [f"dns+tcp://{RELEASE}-workers-{urls[0]}:9100"]


def test_several_backends_are_pools_of_one_model_by_file_as_in_the_overflow_overlay(tmp_path):
    docs = template(*only("cuda", "cpu"))
    check_objects(docs)
    assert comparable(docs) == comparable(render("cuda-cpu-overflow"))
    # the file and the flags make the gateway config the overflow overlay describes, gRPC and drain added by flags
    docs = template(*only("cuda", "cpu"), "gateway.grpcPort=50051", "gateway.drainTimeout=45")
    check_objects(docs)
    (config_map,) = by_kind(docs, "ConfigMap").values()
    token = tmp_path / "token"
    token.write_text("t")
    text = config_map["data"]["poolgate.toml"].replace("/var/run/secrets/poolgate/token", str(token))
    (tmp_path / "poolgate.toml").write_text(text)
    argv = by_kind(docs, "Deployment")[f"{RELEASE}-gateway"]["spec"]["template"]["spec"]["containers"][0]["args"]
    argv = [str(tmp_path / "poolgate.toml") if a.endswith(".toml") else a for a in argv]
    args = parse_noting_given(serve.add_arguments, argv[1:])  # as `poolgate serve` parses: flags over the file
    config = serve.config_from_args(args, {})
    assert [(p.backend, p.remotes) for p in config.pools] == [
        ("cuda", ("dns+tcp://poolgate-workers-cuda:9100",)),
        ("cpu", ("dns+tcp://poolgate-workers-cpu:9100",)),
    ]
    assert config.grpc is not None and config.grpc.port == 50051
    assert (config.drain_timeout_s, config.worker_security.token) == (45, "t")


def test_the_grpc_port_is_served_only_when_set():
    for docs, port in ((template("gateway.grpcPort=null"), None), (template(), 50051), (template("gateway.grpcPort=7000"), 7000)):
        pod = by_kind(docs, "Deployment")[f"{RELEASE}-gateway"]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        service = by_kind(docs, "Service")[f"{RELEASE}-gateway"]["spec"]["ports"]
        assert cli_args(container["args"]).grpc_port == port
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports.get("grpc") == port and ports["http"] == 8000
        assert [p for p in service if p["name"] == "grpc"] == (
            [] if port is None else [{"name": "grpc", "port": port, "targetPort": "grpc"}]
        )


def test_a_release_names_its_objects_and_the_gateway_finds_its_own_workers():
    docs = template(*only("rocm"))
    out = helm("template", "search", str(CHART), *(a for s in only("rocm") for a in ("--set", s)))
    renamed = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {d["metadata"]["name"] for d in renamed} == {
        d["metadata"]["name"].replace(RELEASE, "search", 1) for d in docs
    }
    gateway = by_kind(renamed, "Deployment")["search-gateway"]["spec"]["template"]["spec"]["containers"][0]
    (url,) = cli_args(gateway["args"]).worker_url
    assert url == "dns+tcp://search-workers-rocm:9100" and "search-workers-rocm" in by_kind(renamed, "Service")
    selector = by_kind(renamed, "Service")["search-workers-rocm"]["spec"]["selector"]
    assert selector["app.kubernetes.io/instance"] == "search"  # two releases' workers never mix
