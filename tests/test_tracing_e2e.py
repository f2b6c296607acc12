"""Tracing across real processes: `poolgate serve` and `poolgate worker` export to one OTLP/HTTP receiver.

The flags and OTEL_* variables go through the CLI edge; the spans still
queued are exported when each process stops (SIGTERM), so the receiver
holds them all once both have exited.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.request

from poolgate.shared.telemetry import names
from tests.otlp_receiver import SERVER, OtlpReceiver
from tests.processes import free_port, wait_healthy

POOLGATE = [sys.executable, "-m", "poolgate.gateway.cli"]
FAKE = ["--runner-factory", "tests.workers.fake_factory:build"]


def test_one_trace_across_gateway_and_worker_processes(tmp_path):
    worker_port, gateway_port = free_port(), free_port()
    url = f"http://127.0.0.1:{gateway_port}"
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with OtlpReceiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env |= {"OTEL_SERVICE_NAME": "pg-test", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url}
        worker = subprocess.Popen([*POOLGATE, "worker", str(tmp_path), "--served-model-name", "m", "--listen",
                                   f"tcp://127.0.0.1:{worker_port}", "--collect-detailed-traces", *FAKE],
                                  env=env, stderr=subprocess.PIPE, text=True)
        gateway = subprocess.Popen([*POOLGATE, "serve", "--port", str(gateway_port), "--otlp-traces-endpoint",
                                    receiver.url, "--worker-url", f"tcp://127.0.0.1:{worker_port}",
                                    "--collect-detailed-traces"],  # its own child span: tokenize
                                   env=env, stderr=subprocess.PIPE, text=True)
        try:
            wait_healthy(url, proc=gateway)
            request = urllib.request.Request(
                f"{url}/v1/embeddings", json.dumps({"model": "m", "input": ["one two", "three"]}).encode(),
                {"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{parent_id}-01"})
            with urllib.request.urlopen(request, timeout=10) as r:
                body = json.load(r)
        finally:
            for proc in (gateway, worker):
                proc.send_signal(signal.SIGTERM)
            codes = [proc.wait(timeout=30) for proc in (gateway, worker)]
        assert codes == [0, 0], gateway.stderr.read() + worker.stderr.read()
    (span,) = receiver.named(names.SPAN_NAME)
    assert (span.trace_id, span.parent_span_id, span.kind) == (trace_id, parent_id, SERVER)
    assert span.service_name == "pg-test"
    assert span.attributes[names.ATTR_PROMPT_TOKENS] == body["usage"]["prompt_tokens"]
    children = {s.name: s for s in receiver.spans if s is not span}
    assert sorted(children) == sorted(names.CHILD_SPANS)
    assert {(c.trace_id, c.parent_span_id) for c in children.values()} == {(trace_id, span.span_id)}
