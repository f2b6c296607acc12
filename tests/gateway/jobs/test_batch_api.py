"""OpenAI's Files and Batch API through the unmodified ``openai`` SDK: a batch runs to ``completed`` with the answers
``/v1/embeddings`` gives, bad lines fail alone, a bad file fails the batch, lists page, files are deleted."""
from __future__ import annotations

import base64
import json

import numpy as np
import openai
import pytest

from tests.fakes import expected_vector, fake_ids
from tests.gateway.jobs.conftest import embed_line, jsonl

TEXTS = [f"text number {i} " + "word " * (i % 7) for i in range(30)]


def read_lines(content: bytes) -> list[dict]:
    return [json.loads(line) for line in content.splitlines()]


async def test_a_batch_runs_to_completed_with_the_embeddings_routes_answers(batch_server):
    server = await batch_server()
    client = server.client()
    lines = [embed_line(f"doc-{i}", text) for i, text in enumerate(TEXTS)]
    lines.append(embed_line("pair", [TEXTS[0], TEXTS[1]], encoding_format="base64"))
    upload = await client.files.create(file=("docs.jsonl", jsonl(lines)), purpose="batch")
    assert (upload.object, upload.purpose, upload.filename, upload.status) == ("file", "batch", "docs.jsonl", "processed")
    assert upload.bytes == len(jsonl(lines).getvalue())
    assert upload.expires_at == upload.created_at + 30 * 24 * 3600  # OpenAI's default for batch files

    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h",
                                        metadata={"project": "corpus-7"})
    assert batch.status == "validating" and batch.expires_at == batch.created_at + 24 * 3600
    done = await server.wait(client, batch.id)

    assert done.status == "completed", done
    assert done.request_counts.model_dump() == {"total": 31, "completed": 31, "failed": 0}
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    assert done.failed_at is done.cancelled_at is done.expired_at is None
    assert done.metadata == {"project": "corpus-7"} and done.model == "fake-model"
    tokens = sum(len(fake_ids(t)) for t in TEXTS) + len(fake_ids(TEXTS[0])) + len(fake_ids(TEXTS[1]))
    assert done.usage.input_tokens == done.usage.total_tokens == tokens and done.usage.output_tokens == 0
    assert done.error_file_id is None  # no line failed: no error file, as OpenAI's
    output = await client.files.retrieve(done.output_file_id)
    assert (output.purpose, output.filename) == ("batch_output", f"{batch.id}_output.jsonl")

    content = (await client.files.content(done.output_file_id)).content
    assert output.bytes == len(content)
    answers = {line["custom_id"]: line for line in read_lines(content)}
    assert sorted(answers) == sorted(line["custom_id"] for line in lines)  # each exactly once
    live = await client.embeddings.create(model="fake-model", input=TEXTS, encoding_format="float")
    for i, text in enumerate(TEXTS):
        line = answers[f"doc-{i}"]
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
        vector = line["response"]["body"]["data"][0]["embedding"]
        assert vector == live.data[i].embedding  # the same route, the same answer
        assert np.allclose(vector, expected_vector(text), atol=1e-6)
    pair = answers["pair"]["response"]["body"]["data"]  # base64 float32, as asked
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in pair]
    assert np.array_equal(decoded, np.float32([live.data[0].embedding, live.data[1].embedding]))

async def test_bad_lines_fail_alone_with_the_routes_own_answers(batch_server):
    server = await batch_server()
    client = server.client()
    lines = [
        embed_line("good-1", "fine"),
        "{not json",
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}},
        {"custom_id": "score", "method": "POST", "url": "/v1/score", "body": {"text_1": "a", "text_2": "b"}},
        embed_line("hex", "x", encoding_format="hex"),
        embed_line("long", " ".join(f"w{i}" for i in range(40))),  # over the fake model's 32 tokens
        embed_line("good-1", "again"),  # a custom_id used twice
        {"method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}},  # no custom_id
        embed_line("good-2", "also fine"),
    ]
    upload = await client.files.create(file=("mixed.jsonl", jsonl(lines)), purpose="batch")
    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    done = await server.wait(client, batch.id)
    assert done.status == "completed" and done.errors is None
    assert done.request_counts.model_dump() == {"total": 9, "completed": 2, "failed": 7}

    ok = read_lines((await client.files.content(done.output_file_id)).content)
    assert sorted(line["custom_id"] for line in ok) == ["good-1", "good-2"]
    failed = {line["error"]["line"]: line for line in read_lines((await client.files.content(done.error_file_id)).content)}
    assert sorted(failed) == [2, 3, 4, 5, 6, 7, 8]
    assert "not valid JSON" in failed[2]["error"]["message"] and failed[2]["response"] is None
    assert "/v1/chat/completions" in failed[3]["error"]["message"] and failed[3]["custom_id"] == "chat"
    assert "differs from the batch's endpoint" in failed[4]["error"]["message"]
    for number in (5, 6):  # the route refused the body: its status and its own error body are kept
        assert failed[number]["response"]["status_code"] == 400
        assert failed[number]["response"]["body"]["error"]["message"] == failed[number]["error"]["message"]
    assert failed[7]["error"]["code"] == "duplicate_custom_id" and failed[7]["custom_id"] is None
    assert "custom_id" in failed[8]["error"]["message"]


@pytest.mark.parametrize("content, code", [
    (b"", "empty_file"),
    (b"\n  \n", "empty_file"),
    (b"a,b,c\n1,2,3\n", "invalid_file"),
    (b'[{"custom_id": "x"}]\n', "invalid_file"),
    (b"\n".join([json.dumps(embed_line(f"r{i}", "x")).encode() for i in range(4)]), "too_many_lines"),
])
async def test_a_file_that_is_not_a_batch_fails_the_batch(batch_server, content, code):
    server = await batch_server(max_lines=3)
    client = server.client()
    upload = await client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    done = await server.wait(client, batch.id)
    assert done.status == "failed" and done.failed_at and done.in_progress_at is None
    assert [e.code for e in done.errors.data] == [code] and done.errors.data[0].message
    assert done.output_file_id is None and done.error_file_id is None


async def test_lists_page_with_cursors_newest_first(batch_server):
    server = await batch_server()
    client = server.client()
    upload = await client.files.create(file=("in.jsonl", jsonl([embed_line("a", "x")])), purpose="batch")
    made = []
    for _ in range(5):
        made.append((await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings",
                                                 completion_window="24h")).id)
    page = await client.batches.list(limit=2)
    assert [b.id for b in page.data] == made[::-1][:2] and page.has_more
    assert page.model_dump()["first_id"] == made[-1] and page.model_dump()["last_id"] == made[-2]
    assert [b.id async for b in client.batches.list(limit=2)] == made[::-1]  # the SDK follows the cursor
    last = await client.batches.list(limit=2, after=made[1])
    assert [b.id for b in last.data] == [made[0]] and not last.has_more
    with pytest.raises(openai.BadRequestError):
        await client.batches.list(limit=101)
    with pytest.raises(openai.BadRequestError):
        await client.batches.list(after="batch_nope")

    for batch_id in made:
        await server.wait(client, batch_id)
    files = [f async for f in client.files.list(limit=2)]  # the input and five outputs, newest first
    assert len(files) == 6 and files[-1].id == upload.id
    assert [f.id async for f in client.files.list(purpose="batch")] == [upload.id]
    ascending = [f.id async for f in client.files.list(order="asc", limit=4)]
    assert ascending == [f.id for f in files][::-1]


async def test_a_file_is_deleted_once_no_running_batch_reads_it(batch_server):
    server = await batch_server()
    client = server.client()
    upload = await client.files.create(file=("in.jsonl", jsonl([embed_line("a", "x")])), purpose="batch")
    batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    done = await server.wait(client, batch.id)
    deleted = await client.files.delete(done.output_file_id)
    assert (deleted.id, deleted.deleted) == (done.output_file_id, True)
    assert not (server.folder / "files" / done.output_file_id).exists()
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError):
            await call(done.output_file_id)
    assert done.output_file_id not in [f.id async for f in client.files.list()]


async def test_without_batch_dir_the_routes_say_how_to_turn_them_on(gateway):
    client = await gateway()
    for method, path in (("POST", "/v1/batches"), ("GET", "/v1/files"), ("GET", "/v1/batches/batch_x")):
        resp = await client.request(method, path, json={} if method == "POST" else None)
        body = await resp.json()
        assert resp.status == 404 and "--batch-dir" in body["error"]["message"], body
    doc = await (await client.get("/openapi.json")).json()
    assert not any(path.startswith(("/v1/files", "/v1/batches")) for path in doc["paths"])


async def test_openapi_documents_the_batch_routes_when_on(batch_server):
    from openapi_spec_validator import validate

    server = await batch_server()
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/openapi.json") as resp:
        doc = await resp.json()
    validate(doc)
    paths = doc["paths"]
    assert set(paths) >= {"/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content", "/v1/batches",
                          "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel"}
    upload = paths["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    form = doc["components"]["schemas"][upload["$ref"].rsplit("/", 1)[1]]
    assert {"file", "purpose"} <= set(form["required"]) and form["properties"]["file"]["format"] == "binary"
    listed = {p["name"] for p in paths["/v1/batches"]["get"]["parameters"]}
    assert listed == {"after", "limit"}
    assert {p["name"] for p in paths["/v1/files"]["get"]["parameters"]} == {"after", "limit", "order", "purpose"}
    assert paths["/v1/batches"]["post"]["requestBody"]["content"]["application/json"]
