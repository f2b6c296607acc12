"""bench --jobs and --beside-job against a live gateway (bundled model, --batch-dir): the reports add up."""
from __future__ import annotations

import json
import subprocess
import sys

from poolgate.gateway.bench.jobs import write_job
from poolgate.gateway.bench.load import LoadConfig
from tests.environment import clean_env
from tests.live_server import live_server


def test_write_job_makes_one_batch_line_per_request(tmp_path):
    cfg = LoadConfig(url="http://x", model="m", batch_size=2)
    n = write_job(tmp_path / "in.jsonl", ["a", "b", "c"], cfg)
    lines = [json.loads(x) for x in (tmp_path / "in.jsonl").read_text().splitlines()]
    assert n == 2 and [x["custom_id"] for x in lines] == ["r0", "r1"]
    assert lines[1] == {"custom_id": "r1", "method": "POST", "url": "/v1/embeddings",
                        "body": {"model": "m", "input": ["c"], "encoding_format": "base64",
                                 "truncate_prompt_tokens": -1}}


def bench(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", "bench", *args], capture_output=True,
                         text=True, env=clean_env(), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_jobs_and_beside_job_against_a_live_gateway(tmp_path):
    with live_server(tmp_path, "--batch-dir", str(tmp_path / "batches")) as server:
        report = bench("--url", server.url, "--jobs", "--no-in-process", "--num-texts", "96", "--batch-size", "4",
                       "--concurrency", "4", "--warmup", "1")
        assert report["lines"] == 24 and report["errors"] == 0
        live, job = report["live"], report["job_through_gateway"]
        assert live["inputs"] == 96 and job["lines"] == 24 and job["failed"] == 0
        assert job["tokens"] == live["tokens"] > 0  # the same requests, the same counted tokens
        assert job["ratio_to_live"] > 0 and "job_in_process" not in report

        beside = bench("--url", server.url, "--beside-job", "2000", "--batch-size", "4", "--concurrency", "2",
                       "--duration", "2", "--num-texts", "64", "--warmup", "1")
        assert beside["errors"] == 0 and beside["job_lines"] == 2000
        assert beside["live_alone"]["inputs"] > 0 and beside["live_beside_job"]["inputs"] > 0
        assert beside["live_beside_job"]["latency_ms"]["p99"] is not None
        assert beside["job_status_at_end"] in ("cancelling", "cancelled", "in_progress", "completed")
