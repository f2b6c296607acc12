"""What the Batch API refuses, and whose is what: bad batches and uploads get a 4xx naming the fault, an upload past
a limit a 413 (while it is read, nothing left on disk), and a tenant sees and runs only its own files and batches."""
from __future__ import annotations

import aiohttp
import openai
import pytest

from poolgate.gateway.http.trusted import TRUSTED
from tests.gateway.jobs.conftest import KEYS, embed_line, jsonl

LINE = jsonl([embed_line("a", "hello")]).getvalue()


def uploads_left(server) -> list[str]:
    return [p.name for p in (server.folder / "files").iterdir() if p.name.startswith(".upload-")]


@pytest.mark.parametrize("change, param, says", [
    ({"endpoint": "/v1/chat/completions"}, "endpoint", "not served here"),
    ({"endpoint": "/v1/embeddings/"}, "endpoint", "not served here"),
    ({"completion_window": "1h"}, "completion_window", "24h"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16 pairs"),
    ({"metadata": {"k" * 65: "v"}}, "metadata", "at most 64 characters"),
    ({"metadata": {"k": "v" * 513}}, "metadata", "at most 512 characters"),
    ({"output_expires_after": {"anchor": "created_at", "seconds": 60}}, "output_expires_after", "3600"),
    ({"surprise": 1}, "surprise", "Extra inputs"),
])
async def test_a_batch_the_api_cannot_run_is_a_400_naming_the_field(batch_server, change, param, says):
    server = await batch_server()
    client = server.client()
    upload = await client.files.create(file=("in.jsonl", LINE), purpose="batch")
    body = {"input_file_id": upload.id, "endpoint": "/v1/embeddings", "completion_window": "24h", **change}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.post("/batches", body=body, cast_to=object)
    error = refused.value.body
    assert error["param"].startswith(f"body.{param}") and says in error["message"], error  # vLLM's param: body.FIELD
    assert [b async for b in client.batches.list()] == []


async def test_a_batch_needs_a_batch_file_of_the_caller(batch_server):
    server = await batch_server()
    client = server.client()
    with pytest.raises(openai.NotFoundError) as missing:
        await client.batches.create(input_file_id="file-nope", endpoint="/v1/embeddings", completion_window="24h")
    assert missing.value.body["param"] == "input_file_id"
    upload = await client.files.create(file=("in.jsonl", LINE), purpose="batch")
    done = await server.wait(client, (await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")).id)
    with pytest.raises(openai.BadRequestError, match="purpose 'batch_output'"):  # an output is not an input
        await client.batches.create(input_file_id=done.output_file_id, endpoint="/v1/embeddings",
                                    completion_window="24h")


@pytest.mark.parametrize("purpose", ["fine-tune", "assistants", "batch_output", "user_data"])
async def test_only_batch_files_are_taken(batch_server, purpose):
    server = await batch_server()
    with pytest.raises(openai.BadRequestError, match=f"purpose '{purpose}' is not served here"):
        await server.client().files.create(file=("in.jsonl", LINE), purpose=purpose)
    assert uploads_left(server) == [] and list((server.folder / "files").iterdir()) == []


async def test_an_upload_form_is_checked(batch_server):
    server = await batch_server()
    client = server.client()
    expiring = await client.files.create(file=("in.jsonl", LINE), purpose="batch",
                                         expires_after={"anchor": "created_at", "seconds": 7200})
    assert expiring.expires_at == expiring.created_at + 7200
    with pytest.raises(openai.BadRequestError, match=r"expires_after\[seconds\]"):
        await client.files.create(file=("in.jsonl", LINE), purpose="batch",
                                  expires_after={"anchor": "created_at", "seconds": 60})
    async with aiohttp.ClientSession() as http:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("colour", "blue")
        form.add_field("file", LINE, filename="in.jsonl")
        async with http.post(f"{server.url}/v1/files", data=form) as resp:
            assert resp.status == 400 and "unknown form field 'colour'" in (await resp.json())["error"]["message"]
        async with http.post(f"{server.url}/v1/files", json={"purpose": "batch"}) as resp:
            assert resp.status == 400 and "multipart/form-data" in (await resp.json())["error"]["message"]
        form = aiohttp.FormData(default_to_multipart=True)
        form.add_field("purpose", "batch")
        async with http.post(f"{server.url}/v1/files", data=form) as resp:
            assert resp.status == 400 and "'file'" in (await resp.json())["error"]["message"]
        raw = b'--b\r\nContent-Disposition: form-data; name="\xc2\x87u\x10"\r\n\r\nx\r\n--b--\r\n'  # (the fuzzer's)
        async with http.post(f"{server.url}/v1/files", data=raw,
                             headers={"Content-Type": "multipart/form-data; boundary=b"}) as resp:
            assert resp.status == 400 and "malformed multipart" in (await resp.json())["error"]["message"]
    assert uploads_left(server) == []


async def test_a_file_over_the_limit_is_a_413_while_it_is_read(batch_server):
    server = await batch_server(max_file_bytes=1000)
    client = server.client()
    assert (await client.files.create(file=("in.jsonl", b"x" * 1000), purpose="batch")).bytes == 1000
    with pytest.raises(openai.APIStatusError) as refused:
        await client.files.create(file=("in.jsonl", b"x" * 1001), purpose="batch")
    assert refused.value.status_code == 413 and "0 MB" in refused.value.body["message"]
    assert uploads_left(server) == [] and len([f async for f in client.files.list()]) == 1


async def test_a_tenants_storage_is_capped_and_freed_by_deleting(batch_server):
    server = await batch_server(with_tenants=True, tenant_bytes=1500)
    a, b = server.client(KEYS["team-a"]), server.client(KEYS["team-b"])
    first = await a.files.create(file=("in.jsonl", b"x" * 1000), purpose="batch")
    with pytest.raises(openai.APIStatusError) as refused:
        await a.files.create(file=("in.jsonl", b"x" * 600), purpose="batch")
    assert refused.value.status_code == 413 and "team-a" in refused.value.body["message"]
    assert (await b.files.create(file=("in.jsonl", b"x" * 1000), purpose="batch")).bytes == 1000  # its own room
    await a.files.delete(first.id)
    assert (await a.files.create(file=("in.jsonl", b"x" * 600), purpose="batch")).bytes == 600
    assert uploads_left(server) == []


async def test_a_tenant_sees_and_runs_only_its_own(batch_server):
    server = await batch_server(with_tenants=True, metrics=True)
    a, b = server.client(KEYS["team-a"]), server.client(KEYS["team-b"])
    upload = await a.files.create(file=("in.jsonl", jsonl([embed_line(f"r{i}", "x") for i in range(3)])),
                                  purpose="batch")
    batch = await a.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    done = await server.wait(a, batch.id)
    assert done.status == "completed"
    for call, arg in ((b.files.retrieve, upload.id), (b.files.content, done.output_file_id),
                      (b.files.delete, upload.id), (b.batches.retrieve, batch.id), (b.batches.cancel, batch.id)):
        with pytest.raises(openai.NotFoundError):
            await call(arg)
    with pytest.raises(openai.NotFoundError):  # a batch on another tenant's file
        await b.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    assert [f async for f in b.files.list()] == [] and [x async for x in b.batches.list()] == []
    assert {f.id async for f in a.files.list()} == {upload.id, done.output_file_id}
    with pytest.raises(openai.AuthenticationError):
        await server.client("sk-wrong").files.list()
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as resp:
        text = await resp.text()
    assert 'poolgate_tenant_requests_total{model="fake-model",status="200",tenant="team-a"} 3.0' in text
    assert 'model="fake-model",status="200",tenant="team-b"' not in text  # the lines ran as the batch's tenant, and only as it


async def test_the_job_token_is_this_process_own(batch_server):
    server = await batch_server(with_tenants=True)
    right = server.app[TRUSTED].headers("team-a")
    body = {"model": "fake-model", "input": "x"}
    async with aiohttp.ClientSession() as http:
        async def status(headers: dict, path: str = "/v1/embeddings") -> int:
            async with http.post(f"{server.url}{path}", json=body, headers=headers) as resp:
                return resp.status

        assert await status(right) == 200
        assert await status({**right, "X-Poolgate-Job-Token": "guess"}) == 401
        assert await status({**right, "X-Poolgate-Job-Tenant": "nobody"}) == 401
        assert await status({"X-Poolgate-Job-Tenant": "team-a"}) == 401  # a name alone is no key
        assert await status(right, "/admin/models") == 403


async def test_a_batch_whose_tenant_is_refused_fails_without_failing_its_lines(batch_server, monkeypatch):
    from poolgate.gateway.http.trusted import TrustedCaller

    server = await batch_server(with_tenants=True)
    a = server.client(KEYS["team-a"])
    upload = await a.files.create(file=("in.jsonl", jsonl([embed_line(f"r{i}", "x") for i in range(3)])),
                                  purpose="batch")
    real = TrustedCaller.headers
    monkeypatch.setattr(TrustedCaller, "headers", lambda self, tenant: real(self, "gone-tenant"))  # keys removed
    batch = await a.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    done = await server.wait(a, batch.id)
    assert done.status == "failed" and [e.code for e in done.errors.data] == ["not_allowed"]
    assert "401" in done.errors.data[0].message and done.request_counts.failed == 0
    assert done.error_file_id is None and done.output_file_id is None
