"""The Batch API of a real ``poolgate serve`` on the bundled MiniLM, through the unmodified ``openai`` SDK: a batch's
vectors are ``/v1/embeddings``' for the same inputs, tenants of ``--api-keys-file`` see only their own, and a gateway
SIGKILLed mid-batch and started again on the same ``--batch-dir`` ends the batch ``completed`` with every line
exactly once, and with ``--gateway-processes 2`` either process takes batches and cancels, the first runs them
(worst cosine printed with -s)."""
from __future__ import annotations

import io
import json
import re
import signal
import sys
import time

import numpy as np
import openai
import pytest
import requests

from poolgate.shared.config.models import DEFAULT_MODEL_NAME as MODEL
from tests.dialect_parity import TEXTS
from tests.live_server import live_server
from tests.processes import alive
from tests.test_gateway_processes_e2e import ADMIN, ADMIN_KEY, _both_pids

KEYS = {"team-a": "sk-batch-team-a", "team-b": "sk-batch-team-b"}
MIN_COSINE = 0.99999
FINAL = ("completed", "failed", "expired", "cancelled")


def keys_file(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text("".join(f'[[tenants]]\nname = "{name}"\nkeys = ["{key}"]\n' for name, key in KEYS.items()))
    return path


def upload(client: openai.OpenAI, lines: list[dict]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def wait(client: openai.OpenAI, batch_id: str, until=FINAL, timeout: float = 120, done=lambda b: True):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until and done(batch):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)


def embed(custom_id: str, text: str) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": text}}


def test_batch_vectors_are_the_embeddings_routes_and_tenants_are_apart(tmp_path):
    with live_server(tmp_path, "--dtype", "float32", "--api-keys-file", str(keys_file(tmp_path)),
                     "--batch-dir", str(tmp_path / "batches")) as server:
        a = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["team-a"], max_retries=0)
        b = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["team-b"], max_retries=0)
        file_id = upload(a, [embed(f"t{i}", text) for i, text in enumerate(TEXTS)])
        batch = a.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
        with pytest.raises(openai.NotFoundError):
            b.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
        done = wait(a, batch.id)
        assert done.status == "completed" and done.request_counts.completed == len(TEXTS), done
        with pytest.raises(openai.NotFoundError):
            b.files.content(done.output_file_id)
        assert [x.id for x in b.batches.list()] == [] and [x.id for x in a.batches.list()] == [batch.id]

        lines = [json.loads(line) for line in a.files.content(done.output_file_id).content.splitlines()]
        got = {line["custom_id"]: line["response"]["body"]["data"][0]["embedding"] for line in lines}
        vectors = np.float32([got[f"t{i}"] for i in range(len(TEXTS))])
        live = a.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
        reference = np.float32([d.embedding for d in live.data])
        cos = (vectors * reference).sum(1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1))
        print(f"batch vs /v1/embeddings: worst cosine {cos.min():.7f}, max |diff| {np.abs(vectors - reference).max():.2e}")
        assert cos.min() >= MIN_COSINE
        assert done.usage.input_tokens == live.usage.prompt_tokens and done.model == MODEL
    assert server.proc.returncode == 0, server.log_text()[-3000:]


def test_a_gateway_killed_mid_batch_resumes_it_with_every_line_once(tmp_path):
    folder, lines = tmp_path / "batches", 2000
    flags = ("--batch-dir", str(folder), "--batch-max-inflight", "32")
    with live_server(tmp_path, *flags) as first:
        client = openai.OpenAI(base_url=f"{first.url}/v1", api_key="none", max_retries=0)
        file_id = upload(client, [embed(f"r{i}", f"line {i}: " + TEXTS[i % len(TEXTS)]) for i in range(lines)])
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
        running = wait(client, batch.id, until=("in_progress",), done=lambda b: b.request_counts.completed > 0)
        workers = first.workers()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    assert 0 < running.request_counts.completed < lines, running
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers):  # they die with the gateway (shared.parent_death)
        assert time.monotonic() < deadline, "a worker outlived its SIGKILLed gateway"
        time.sleep(0.1)

    with live_server(tmp_path, *flags) as second:
        client = openai.OpenAI(base_url=f"{second.url}/v1", api_key="none", max_retries=0)
        done = wait(client, batch.id)
        assert done.status == "completed", done
        assert done.request_counts.model_dump() == {"total": lines, "completed": lines, "failed": 0}
        ids = [json.loads(line)["custom_id"] for line in client.files.content(done.output_file_id).content.splitlines()]
        assert done.error_file_id is None
        assert len(ids) == lines and set(ids) == {f"r{i}" for i in range(lines)}  # each exactly once
        resumed = [line for line in second.log_text().splitlines() if "resuming" in line]
        assert len(resumed) == 1 and batch.id in resumed[0], second.log_text()[-3000:]
    assert second.proc.returncode == 0, second.log_text()[-3000:]


@pytest.mark.skipif(sys.platform != "linux", reason="--gateway-processes needs Linux (SO_REUSEPORT)")
def test_with_two_gateway_processes_either_takes_batches_and_the_first_runs_them(tmp_path):
    flags = ("--gateway-processes", "2", "--api-key", ADMIN_KEY, "--batch-dir", str(tmp_path / "batches"))
    with live_server(tmp_path, *flags) as server:
        assert len(_both_pids(server.url)) == 2

        def fresh() -> openai.OpenAI:  # a new connection: the kernel gives it to either process
            return openai.OpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY, max_retries=0)

        file_id = upload(fresh(), [embed(f"r{i}", TEXTS[i % len(TEXTS)]) for i in range(40)])
        made = [fresh().batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                       completion_window="24h").id for _ in range(6)]
        fresh().batches.cancel(made[-1])
        ends = {batch_id: wait(fresh(), batch_id).status for batch_id in made}
        assert list(ends.values()).count("completed") >= 5 and ends[made[-1]] in ("cancelled", "completed")
        ran = [line for line in server.log_text().splitlines() if "lines to /v1/embeddings" in line]
        assert sorted(re.search(r"batch (batch_\w+)", line)[1] for line in ran) == sorted(
            b for b, status in ends.items() if status == "completed")  # each run once, by one process
        completed = 40 * list(ends.values()).count("completed")
        for _ in range(6):  # either process's scrape: the store's batches, the runner's lines once
            text = requests.get(f"{server.url}/metrics", headers=ADMIN, timeout=10).text
            assert f'poolgate_batch_jobs{{status="completed"}} {float(list(ends.values()).count("completed"))}' in text
            lines = re.search(r'^poolgate_batch_job_lines_total{outcome="completed",tenant="default"} (\S+)$', text,
                              re.M)
            assert lines and float(lines[1]) == completed, text[-2000:]
    assert server.proc.returncode == 0, server.log_text()[-3000:]
