"""/classify and /pooling fill the request's telemetry record: task (so the span's operation), ids, formats."""
from __future__ import annotations

import pytest

from poolgate.shared.telemetry.names import OPERATIONS
from tests.fakes import fake_model

MODEL = dict(tasks=("embed", "classify", "token_embed", "token_classify"), num_labels=3)


async def test_classify_record(recorded):
    client, records = await recorded(fake_model(**MODEL))
    resp = await client.post("/classify", json={"input": ["a b", "c"]})
    assert resp.status == 200
    (record,) = records.records
    assert record.route == "/classify" and record.task == "classify" and OPERATIONS[record.task] == "classify"
    assert record.response_id == (await resp.json())["id"] and record.prompt_tokens == 7
    assert record.model == "fake-model" and record.status == 200
    assert record.dimension_count is None and record.encoding_formats == ()


@pytest.mark.parametrize("task, operation, dims", [
    ("embed", "embeddings", 8), ("token_embed", "embeddings", 8),
    ("classify", "classify", None), ("token_classify", "pooling", None),
])
async def test_pooling_record(recorded, task, operation, dims):
    client, records = await recorded(fake_model(**MODEL))
    resp = await client.post("/pooling", json={"input": "a b", "task": task, "encoding_format": "base64"})
    assert resp.status == 200
    (record,) = records.records
    assert record.route == "/pooling" and record.task == task and OPERATIONS[record.task] == operation
    assert record.response_id == (await resp.json())["id"] and record.prompt_tokens == 4
    assert record.encoding_formats == ("base64",) and record.dimension_count == dims


async def test_default_task_is_recorded(recorded):
    client, records = await recorded(fake_model(**MODEL))
    assert (await client.post("/pooling", json={"input": "a b"})).status == 200
    assert records.records[0].task == "embed"


async def test_a_refused_request_is_recorded_with_its_error(recorded):
    client, records = await recorded(fake_model())
    assert (await client.post("/pooling", json={"input": "a", "task": "classify"})).status == 400
    assert (await client.post("/classify", json={"input": "a"})).status == 404  # no model classifies
    assert [(r.status, r.error_type) for r in records.records] == [
        (400, "invalid_request"), (404, "not_found")]
