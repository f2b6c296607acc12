"""The runner: a cancel stops sending and keeps what finished, a batch past its window expires, a stopped gateway's
batch resumes from its files with no line lost or twice, batches run oldest first, and the metrics and spans."""
from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import openai
import pytest

from poolgate.gateway.telemetry.tracing import build_tracer
from poolgate.shared.config.frozen import TracingConfig
from poolgate.shared.telemetry import names
from tests.fakes import fake_model
from tests.gateway.jobs.conftest import embed_line, jsonl
from tests.otlp_receiver import INTERNAL, OtlpReceiver

DAY = 24 * 3600


def slow_model(delay: float = 0.01):
    """A fake model whose every batch takes ``delay`` s on the "device": a batch of lines takes a while."""
    model = fake_model()
    model.runner.execute_delay = delay
    return model


def ids_in(content: bytes) -> list[str]:
    return [json.loads(line)["custom_id"] for line in content.splitlines()]


async def started(server, client, lines: int, **create):
    """A batch of ``lines`` one-text lines, once some of its lines are done."""
    upload = await client.files.create(file=("in.jsonl", jsonl([embed_line(f"r{i}", f"text {i}")
                                                                  for i in range(lines)])), purpose="batch")
    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h",
                                        **create)
    for _ in range(400):
        batch = await client.batches.retrieve(batch.id)
        if batch.request_counts and batch.request_counts.completed >= 5:
            return batch
        await asyncio.sleep(0.025)
    raise AssertionError(f"no progress: {batch}")


async def test_a_cancel_stops_sending_and_keeps_the_finished_lines(batch_server):
    server = await batch_server(model=slow_model(), max_inflight=2)
    client = server.client()
    batch = await started(server, client, 400)
    assert batch.status == "in_progress" and batch.request_counts.total == 400
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = await server.wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at
    assert 5 <= done.request_counts.completed < 400 and done.request_counts.failed == 0
    ids = ids_in((await client.files.content(done.output_file_id)).content)
    assert len(ids) == len(set(ids)) == done.request_counts.completed  # what finished, each once
    executed = len(server.model.runner.batches)
    await asyncio.sleep(0.3)
    assert len(server.model.runner.batches) == executed  # nothing more was sent
    with pytest.raises(openai.ConflictError, match="cancelled"):
        await client.batches.cancel(batch.id)


async def test_a_batch_not_done_in_its_window_expires_with_its_finished_lines(batch_server):
    server = await batch_server(model=slow_model(), max_inflight=2)
    client = server.client()
    batch = await started(server, client, 400)
    server.clock.offset = DAY + 60
    done = await server.wait(client, batch.id)
    assert done.status == "expired" and done.expired_at >= done.expires_at
    assert 5 <= done.request_counts.completed < 400
    assert len(ids_in((await client.files.content(done.output_file_id)).content)) == done.request_counts.completed


async def test_a_waiting_batch_expires_or_is_cancelled_without_running(batch_server):
    server = await batch_server(model=slow_model(), max_inflight=1, jobs_at_once=1)
    client = server.client()
    first = await started(server, client, 400)
    upload = await client.files.create(file=("in.jsonl", jsonl([embed_line("x", "y")])), purpose="batch")
    waiting = [await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                           completion_window="24h") for _ in range(2)]
    cancelled = await client.batches.cancel(waiting[0].id)
    assert cancelled.status in ("cancelling", "cancelled")
    assert (await server.wait(client, waiting[0].id)).status == "cancelled"
    assert (await client.batches.retrieve(waiting[1].id)).status == "validating"  # its turn has not come
    await client.batches.cancel(first.id)
    done = await server.wait(client, waiting[1].id)  # then it runs
    assert done.status == "completed" and done.in_progress_at >= (await client.batches.retrieve(first.id)).cancelled_at


async def test_expired_files_are_gone_and_swept(batch_server):
    server = await batch_server()
    client = server.client()
    short = await client.files.create(file=("in.jsonl", b"{}\n"), purpose="batch",
                                      expires_after={"anchor": "created_at", "seconds": 3600})
    kept = await client.files.create(file=("in.jsonl", b"{}\n"), purpose="batch")
    server.clock.offset = 3601
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(short.id)
    assert [f.id async for f in client.files.list()] == [kept.id]
    for _ in range(100):
        if not (server.folder / "files" / short.id).exists():
            break
        await asyncio.sleep(0.05)
    assert not (server.folder / "files" / short.id).exists() and (server.folder / "files" / kept.id).exists()


async def test_a_stopped_gateways_batch_resumes_with_each_line_once(batch_server):
    server = await batch_server(model=slow_model(), max_inflight=4)
    client = server.client()
    batch = await started(server, client, 300)
    await server.stop()  # the batch stays in_progress, its lines in flight dropped
    stopped_at = server.model.runner.batches[:]
    output = next(p for p in (server.folder / "files").iterdir() if p.stat().st_size and p.name != batch.input_file_id)
    before = ids_in(output.read_bytes())
    assert 5 <= len(before) < 300
    with open(output, "ab") as f:  # a line a kill cut short: it is redone, not kept
        f.write(b'{"id":"batch_req_cut","custom_id":"r299","response":{"status_co')

    again = await batch_server(model=fake_model(), max_inflight=4)
    client = again.client()
    done = await again.wait(client, batch.id)
    assert done.status == "completed" and done.request_counts.model_dump() == {"total": 300, "completed": 300,
                                                                               "failed": 0}
    ids = ids_in((await client.files.content(done.output_file_id)).content)
    assert sorted(ids) == sorted(f"r{i}" for i in range(300))  # every line, each once
    assert ids[:len(before)] == before  # what the first run wrote stays, first
    resent = sum(len(b) for b in again.model.runner.batches)
    assert resent == 300 - len(before) and stopped_at  # only the rest was sent again


async def test_batches_run_oldest_first(batch_server):
    server = await batch_server(jobs_at_once=1)
    client = server.client()
    upload = await client.files.create(file=("in.jsonl", jsonl([embed_line(f"r{i}", "x") for i in range(20)])),
                                       purpose="batch")
    made = [(await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                         completion_window="24h")).id for _ in range(4)]
    done = [await server.wait(client, batch_id) for batch_id in made]
    starts = [b.in_progress_at for b in done]
    ends = [b.completed_at for b in done]
    assert starts == sorted(starts) and all(e <= s for e, s in zip(ends, starts[1:]))


def series(text: str, name: str) -> dict[str, float]:
    return {labels: float(value) for labels, value in re.findall(rf"^{name}{{(.*)}} (\S+)$", text, re.M)}


async def test_metrics_count_lines_tokens_and_show_each_running_batch(batch_server):
    server = await batch_server(model=slow_model(), max_inflight=2, metrics=True)
    client = server.client()
    batch = await started(server, client, 200)
    async with aiohttp.ClientSession() as http:
        async def scrape() -> str:
            async with http.get(f"{server.url}/metrics") as resp:
                return await resp.text()

        running = await scrape()
        progress = series(running, names.BATCH_JOB_PROGRESS)
        (labels, ratio), = progress.items()
        assert f'batch_id="{batch.id}"' in labels and 'tenant="default"' in labels and 0 < ratio < 1
        assert series(running, names.BATCH_JOBS)['status="in_progress"'] == 1
        done = await server.wait(client, batch.id)
        text = await scrape()
    assert series(text, names.BATCH_JOB_PROGRESS) == {}  # its series went with it
    jobs = series(text, names.BATCH_JOBS)
    assert jobs['status="completed"'] == 1 and jobs['status="in_progress"'] == 0 and len(jobs) == 8
    lines = series(text, names.BATCH_JOB_LINES + "_total")
    assert lines == {'outcome="completed",tenant="default"': 200}
    tokens = series(text, names.BATCH_JOB_TOKENS + "_total")
    assert tokens == {'tenant="default"': done.usage.input_tokens} and done.usage.input_tokens > 0
    requests = series(text, names.REQUESTS + "_total")
    assert requests['model="fake-model",protocol="http",route="/v1/embeddings",status="200"'] == 200  # each line is a request


async def test_one_job_span_with_chunk_spans_parenting_each_lines_request_span(batch_server):
    with OtlpReceiver() as receiver:
        tracer = build_tracer(TracingConfig(endpoint=receiver.url))
        try:
            server = await batch_server(tracer=tracer, chunk_lines=10)
            client = server.client()
            upload = await client.files.create(
                file=("in.jsonl", jsonl([embed_line(f"r{i}", f"t {i}") for i in range(25)] + ["{bad"])),
                purpose="batch")
            batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                                completion_window="24h")
            await server.wait(client, batch.id)
            await server.stop()
            assert await asyncio.to_thread(tracer.force_flush)
        finally:
            tracer.shutdown()
        (job,) = receiver.named("batch_job")
        chunks = receiver.named("batch_chunk")
        lines = [s for s in receiver.named(names.SPAN_NAME) if s.attributes[names.ATTR_HTTP_ROUTE] == "/v1/embeddings"]
    assert job.kind == INTERNAL and job.attributes["poolgate.batch.id"] == batch.id
    assert job.attributes["poolgate.batch.status"] == "completed" and job.attributes["poolgate.batch.failed"] == 1
    assert sorted(c.attributes["poolgate.batch.chunk"] for c in chunks) == [0, 1, 2]
    assert {c.parent_span_id for c in chunks} == {job.span_id} and {c.trace_id for c in chunks} == {job.trace_id}
    assert len(lines) == 25 and {s.trace_id for s in lines} == {job.trace_id}
    per_chunk = sorted(sum(s.parent_span_id == c.span_id for s in lines) for c in chunks)
    assert per_chunk == [5, 10, 10]
    for chunk in chunks:  # a chunk spans its lines
        mine = [s for s in lines if s.parent_span_id == chunk.span_id]
        assert chunk.start_ns <= min(s.start_ns for s in mine) and chunk.end_ns >= max(s.end_ns for s in mine)


async def test_an_unexpected_fault_fails_the_batch_once(batch_server, monkeypatch, caplog):
    from poolgate.gateway.jobs.sinks import JsonlSink

    def disk_full(self, *args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(JsonlSink, "write_ok", disk_full)
    server = await batch_server()
    client = server.client()
    upload = await client.files.create(file=("in.jsonl", jsonl([embed_line(f"r{i}", "x") for i in range(5)])),
                                       purpose="batch")
    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    done = await server.wait(client, batch.id)
    assert done.status == "failed" and done.failed_at and done.in_progress_at
    (error,) = done.errors.data
    assert error.code == "internal_error" and "No space left on device" in error.message
    await asyncio.sleep(0.3)  # several rounds of the runner: it is not run again
    assert (await client.batches.retrieve(batch.id)).status == "failed"
    assert caplog.text.count(f"batch {batch.id} failed") == 1


async def test_one_runner_per_batch_dir_and_the_other_takes_over(batch_server, caplog):
    first = await batch_server(model=slow_model(), max_inflight=2)
    second = await batch_server()  # a second gateway on the same --batch-dir
    client = second.client()  # its API works on the shared store
    batch = await started(second, client, 100)
    assert first.model.runner.batches and not second.model.runner.batches  # the first one runs the lines
    assert "another gateway runs the batches" in caplog.text
    await first.stop()  # its batch stays in_progress; the second takes the folder and resumes it
    done = await second.wait(client, batch.id)
    assert done.status == "completed" and second.model.runner.batches
    ids = ids_in((await client.files.content(done.output_file_id)).content)
    assert sorted(ids) == sorted(f"r{i}" for i in range(100))  # each once, whichever runner sent it
