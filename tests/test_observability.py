"""The observability assets: Grafana dashboard, Prometheus scrape config and alert rules, OTel collector config.

Static checks (JSON and YAML shape, metric names against ``shared.telemetry.names``,
``promtool``, ``yamllint``), then the real one: a live gateway over real
workers (fake model) takes traffic while a real Prometheus scrapes it, and
every dashboard query and alert expression runs through Prometheus's query
API. Tests that need the ``prometheus`` / ``promtool`` / ``yamllint`` binaries
skip with the reason when they are missing; ``.ci/run`` installs them.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from poolgate.gateway.app import make_app
from poolgate.gateway.jobs.metrics import BATCH_METRICS, BatchMetrics
from poolgate.gateway.jobs.runner import BatchRunner
from poolgate.gateway.jobs.service import BATCH_API
from poolgate.gateway.telemetry.metrics import GatewayMetrics
from poolgate.gateway.telemetry.record import Telemetry
from poolgate.shared.telemetry import names
from poolgate.shared.config.frozen import BatchConfig, GatewayConfig, Tenant
from tests.fakes import fake_model
from tests.gateway.conftest import live_server, served_router  # noqa: F401 (live_server is a fixture)

OBS = Path(__file__).resolve().parents[1] / "observability"
DASHBOARD = OBS / "grafana" / "poolgate.json"
PROM_CONFIG = OBS / "prometheus" / "prometheus.yml"
ALERTS = OBS / "prometheus" / "alerts.yml"
ALERT_TESTS = OBS / "prometheus" / "alerts_test.yml"
COLLECTOR = OBS / "otel-collector.yaml"

TENANT_KEY = "sk-observability-tenant"
INSTALL = "apt-get install prometheus (.ci/run does)"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason=f"promtool not installed; {INSTALL}")
needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None,
                                      reason=f"prometheus not installed; {INSTALL}")

# What each telemetry name is, so its exposed sample names are known.
COUNTERS = (names.REQUESTS, names.REQUEST_ERRORS, names.PROMPT_TOKENS, names.ADMISSION_REJECTIONS,
            names.WORKER_RECOVERIES, names.EMBEDDING_CACHE_HITS, names.EMBEDDING_CACHE_MISSES,
            names.TENANT_REQUESTS, names.TENANT_PROMPT_TOKENS, names.DEVICE_OUT_OF_MEMORY,
            names.BATCH_JOB_LINES, names.BATCH_JOB_TOKENS, names.POOL_ADMITTED, names.POOL_ADMITTED_TOKENS,
            names.POOL_REFUSED, names.PREFIX_CACHE_LOOKED_UP, names.PREFIX_CACHE_HITS, names.PREFIX_CACHE_SHARED,
            names.MEDIA_ITEMS)
HISTOGRAMS = (names.REQUEST_DURATION, names.REQUEST_PROMPT_TOKENS, names.QUEUE_TIME, names.INFERENCE_TIME,
              names.BATCH_SIZE, names.BATCH_TOKENS, names.BATCH_FILL)
GAUGES = (names.REQUESTS_IN_FLIGHT, names.REQUESTS_RUNNING, names.REQUESTS_WAITING,
          names.WORKER_UP, names.SEQUENCES_RUNNING, names.SEQUENCES_WAITING,
          names.TOKENS_WAITING, names.DEVICE_MEMORY, names.EMBEDDING_CACHE_BYTES, names.WORKER_TOKENS_PER_S,
          names.BATCH_JOBS, names.BATCH_JOB_PROGRESS, names.POOL_QUEUED_TOKENS, names.POOL_QUEUED_SECONDS,
          names.POOL_CAPACITY, names.PREFIX_CACHE_BYTES)
EXPOSED = frozenset({f"{c}_total" for c in COUNTERS} | {f"{h}_{s}" for h in HISTOGRAMS for s in ("bucket", "sum", "count")}
                    | set(GAUGES))
# The Batch API's series: batches are not one model's (a batch's lines name their models), so its panels take no
# model variable.
BATCH_SERIES = frozenset({f"{names.BATCH_JOB_LINES}_total", f"{names.BATCH_JOB_TOKENS}_total", names.BATCH_JOBS,
                          names.BATCH_JOB_PROGRESS})
METRIC_NAME = re.compile(r"\b" + names.PREFIX + r"_[a-z_]+")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def batch_panels() -> list[dict]:
    """The Batch API's panels (every query of theirs on its series alone)."""
    return [p for p in panels() if all(set(METRIC_NAME.findall(t["expr"])) <= BATCH_SERIES for t in p["targets"])]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_every_telemetry_metric_has_a_kind():
    declared = {v for k, v in vars(names).items() if isinstance(v, str) and k.isupper()
                and v.startswith(f"{names.PREFIX}_")}
    assert declared == set(COUNTERS) | set(HISTOGRAMS) | set(GAUGES)


def test_dashboard_shape():
    board = dashboard()
    assert board["schemaVersion"] >= 36 and board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert variables["model"]["definition"] == f"label_values({names.REQUESTS}_total, {names.MODEL})"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no targets"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


def test_dashboard_queries_use_only_telemetry_metrics():
    used = set()
    for panel in panels():
        for target in panel["targets"]:
            expr = target["expr"]
            found = set(METRIC_NAME.findall(expr))
            assert found and found <= EXPOSED, f"{panel['title']!r}: unknown metric in {expr}"
            assert '$model"' in expr or found <= BATCH_SERIES, f"{panel['title']!r} ignores the model variable: {expr}"
            assert set(re.findall(r"\[([^\]]+)\]", expr)) <= {"$__rate_interval"}, expr
            used |= found
    shown = {n for n in COUNTERS + HISTOGRAMS + GAUGES if any(u.startswith(n) for u in used)}
    assert shown == set(COUNTERS + HISTOGRAMS + GAUGES)  # every metric is on the dashboard


def test_alert_rules_use_only_telemetry_metrics():
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {"PoolgateHighErrorRate", "PoolgateHighLatencyP99", "PoolgateQueueGrowing",
                                           "PoolgateWorkerDown", "PoolgateAdmissionRejections"}
    for rule in rules:
        assert set(METRIC_NAME.findall(rule["expr"])) <= EXPOSED, rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"} and rule["annotations"]["summary"]


@needs_promtool
def test_promtool_checks_config_and_rules():
    for args in (["check", "config", PROM_CONFIG], ["check", "rules", ALERTS], ["test", "rules", ALERT_TESTS]):
        done = subprocess.run(["promtool", *map(str, args)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"promtool {args[:2]}: {done.stdout}{done.stderr}"


def test_collector_receives_otlp_and_exports_traces():
    config = yaml.safe_load(COLLECTOR.read_text())
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"]["endpoint"].endswith(":4318")
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and traces["exporters"]
    for kind in ("receivers", "processors", "exporters"):
        for component in traces.get(kind, []):
            assert component in config[kind], f"{component} used in the traces pipeline but not defined"


@pytest.mark.skipif(shutil.which("yamllint") is None, reason="yamllint not installed; apt-get install yamllint")
def test_yaml_files_lint_clean():
    rules = "{extends: default, rules: {line-length: {max: 160}, document-start: disable}}"
    files = [str(p) for p in (PROM_CONFIG, ALERTS, ALERT_TESTS, COLLECTOR)]
    done = subprocess.run(["yamllint", "--strict", "-d", rules, *files], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# --- against a real Prometheus ------------------------------------------------------

SERVED = "fake-model"
EMBED = "/v1/embeddings"
LONG = " ".join(["word"] * 40)  # 42 tokens > the fake's 32: a 400
RATE_INTERVAL = "30s"
# Panels that show traffic: after the load every query of theirs has a positive value.
TRAFFIC_PANELS = {"Request rate by model and route", "Requests by status", "Errors by type", "Request latency",
                  "p99 latency by route", "Queue time vs inference time (p95)",
                  "Queue time vs inference time (average)", "Prompt tokens/s", "Prompt tokens per request",
                  "Batch fill", "Batch size", "Batch tokens", "Admission rejections (429)", "Workers up",
                  "Device memory"}


def grafana_vars(expr: str) -> str:
    return (expr.replace("$model", SERVED).replace("$__rate_interval", RATE_INTERVAL)
            .replace("$__interval", "1s").replace("$__range", "5m"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_config(tmp_path: Path, target: str) -> Path:
    """The shipped prometheus.yml, scraping ``target`` every second, with the shipped alert rules."""
    config = yaml.safe_load(PROM_CONFIG.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(ALERTS)]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "poolgate"]
    job.update(scrape_timeout="1s", static_configs=[{"targets": [target]}])
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


class Prometheus:
    """A prometheus process on a free loopback port and its HTTP API."""

    def __init__(self, tmp_path: Path, target: str):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = tmp_path / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={scrape_config(tmp_path, target)}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address={self.url[7:]}"],
                stdout=log, stderr=subprocess.STDOUT)
        self.http = aiohttp.ClientSession()

    async def get(self, path: str, **params) -> dict:
        async with self.http.get(self.url + path, params=params) as resp:
            return await resp.json()

    async def query(self, expr: str) -> list[dict]:
        body = await self.get("/api/v1/query", query=expr)
        assert body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    async def until(self, what: str, check, timeout: float = 20.0):
        """Poll the async ``check`` until it returns something truthy; fail with the log tail after ``timeout``."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"prometheus exited: {self.log.read_text()[-2000:]}"
            try:
                got = await check()
            except aiohttp.ClientConnectionError:
                got = None
            if got:
                return got
            await asyncio.sleep(0.2)
        pytest.fail(f"prometheus: {what} not reached in {timeout} s; log: {self.log.read_text()[-2000:]}")

    async def scraped_requests(self, count: int) -> None:
        async def seen():
            result = await self.query(f"sum({names.REQUESTS}_total)")
            return result and float(result[0]["value"][1]) == count
        await self.until(f"a scrape with {count} requests", seen)

    async def close(self) -> None:
        await self.http.close()
        self.proc.terminate()
        try:
            await asyncio.to_thread(self.proc.wait, 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def send_load(http: aiohttp.ClientSession, base: str, model, *, ok: int, bad: int) -> int:
    """``ok`` embeddings, ``bad`` over-long inputs (400), an image for the text model (400) and one 429; the
    number of requests sent."""
    for i in range(ok):
        texts = [" ".join(f"w{j}" for j in range(1 + (i * k) % 20)) for k in range(1, 2 + i % 4)]
        async with http.post(base + EMBED, json={"model": SERVED, "input": texts}) as resp:
            assert resp.status == 200, await resp.text()
    for _ in range(bad):
        async with http.post(base + EMBED, json={"model": SERVED, "input": LONG}) as resp:
            assert resp.status == 400
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    async with http.post(base + EMBED, json={"model": SERVED, "messages": [{"role": "user", "content": [image]}]}) as resp:
        assert resp.status == 400  # a text model: the image is counted (media items), then refused
    model.runner.entered.clear()
    model.runner.release.clear()  # hold a batch on the "device": with max_in_flight=1 the next call gets 429
    held = asyncio.create_task(post(http, base, f"held {ok}"))  # new each round: the embedding cache has none
    await asyncio.to_thread(model.runner.entered.wait, 5)
    assert await post(http, base, "refused") == 429
    model.runner.release.set()
    assert await held == 200
    return ok + bad + 3


async def start_batch(http: aiohttp.ClientSession, base: str, lines: int) -> None:
    """Upload ``lines`` embedding requests and start a batch of them (OpenAI's Files and Batch routes)."""
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    text = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": EMBED,
                               "body": {"model": SERVED, "input": f"batch line {i}"}}) + "\n" for i in range(lines))
    form.add_field("file", text.encode(), filename="lines.jsonl")
    async with http.post(base + "/v1/files", data=form) as resp:
        assert resp.status == 200, await resp.text()
        file_id = (await resp.json())["id"]
    body = {"input_file_id": file_id, "endpoint": EMBED, "completion_window": "24h"}
    async with http.post(base + "/v1/batches", json=body) as resp:
        assert resp.status == 200, await resp.text()


async def post(http: aiohttp.ClientSession, base: str, text: str) -> int:
    async with http.post(base + EMBED, json={"model": SERVED, "input": text}) as resp:
        return resp.status


def values(result: list[dict]) -> list[float]:
    return [float(r["value"][1]) for r in result]


class _RisingPrefixStats:
    """A prefix cache's health figures (workers.engine.prefix_cache), rising at each health answer."""

    def __init__(self):
        self.n = 0

    def stats(self) -> dict[str, int]:
        self.n += 1
        return {"looked_up_tokens": 100 * self.n, "hit_tokens": 60 * self.n, "shared_tokens": 20 * self.n,
                "blocks": 4, "bytes": 4096}


@needs_prometheus
async def test_dashboard_and_alerts_against_a_real_prometheus(tmp_path, live_server):  # noqa: F811
    model = dataclasses.replace(fake_model(name=SERVED), device_memory=lambda: {"allocated": 3 << 20,
                                                                                "reserved": 4 << 20},
                                cache_bytes=1 << 20)  # the embedding cache's series too
    model.runner.prefix_cache = _RisingPrefixStats()  # and a causal decoder's prefix cache's
    async with served_router([model], max_in_flight=1) as router:
        served = router.pools[SERVED].pools[0]
        served.member(served.clients[0]).tokens_per_s = 1000.0  # what health checks (none run here) would measure
        metrics = GatewayMetrics(router)
        # One tenant, so the per-tenant usage series exist (every request below carries its key).
        tenant = Tenant("team-a", (hashlib.sha256(TENANT_KEY.encode()).hexdigest(),))
        # The Batch API on, its runner's lines over the app's own unix socket, so its series exist too.
        config = GatewayConfig(tenants=(tenant,), batch=BatchConfig(dir=str(tmp_path / "batches"), max_inflight=1))
        runner = BatchRunner(str(tmp_path / "gateway.sock"), poll_s=0.1, progress_s=0.1)
        app = make_app(config, router, telemetry=Telemetry(recorder=metrics), cleanup_ctx=[runner.run])
        app[BATCH_METRICS] = BatchMetrics(metrics, app[BATCH_API])
        metrics.add_route(app)
        base = await live_server(app, unix=runner.socket)
        prom = Prometheus(tmp_path, base.removeprefix("http://"))
        try:
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TENANT_KEY}"}) as http:
                await prom.until("a first scrape of the gateway", lambda: prom.query('up{job="poolgate"} == 1'))
                # Two rounds, each seen by a scrape, so every counter has risen between two samples.
                sent = await send_load(http, base, model, ok=12, bad=2)
                await prom.scraped_requests(sent)
                sent += await send_load(http, base, model, ok=24, bad=3)
                await prom.scraped_requests(sent)
                # A batch that runs through the checks below (its lines one at a time, each 50 ms on the device).
                model.runner.execute_delay = 0.05
                await start_batch(http, base, lines=600)
                for panel in batch_panels():
                    for target in panel["targets"]:
                        expr = grafana_vars(target["expr"])
                        await prom.until(f"{panel['title']!r} has data", lambda e=expr: prom.query(e))

            # The table above is what the gateway really exposes (prometheus_client's *_created aside).
            exposed = {r["metric"]["__name__"] for r in await prom.query(
                f'count by (__name__) ({{__name__=~"{names.PREFIX}_.*", __name__!~".*_created"}})')}
            assert exposed == EXPOSED

            for panel in panels():
                for target in panel["targets"]:
                    result = await prom.query(grafana_vars(target["expr"]))
                    assert result, f"{panel['title']!r}: no data for {target['expr']}"
                    if panel["title"] in TRAFFIC_PANELS:
                        assert any(math.isfinite(v) and v > 0 for v in values(result)), \
                            f"{panel['title']!r}: {target['expr']} -> {result}"

            for rule in alert_rules():
                await prom.query(rule["expr"])  # valid PromQL

            async def rules_evaluated():
                groups = (await prom.get("/api/v1/rules"))["data"]["groups"]
                return all(r["health"] == "ok" for g in groups for r in g["rules"])
            await prom.until("every alert rule evaluated", rules_evaluated)

            # 2 of ~45 requests refused: the admission alert is pending (for: 10m); nothing else is active.
            async def active_alerts():
                alerts = (await prom.get("/api/v1/alerts"))["data"]["alerts"]
                return {(a["labels"]["alertname"], a["state"]) for a in alerts} or None
            assert await prom.until("the admission alert", active_alerts) == {("PoolgateAdmissionRejections",
                                                                                  "pending")}
        finally:
            await prom.close()
