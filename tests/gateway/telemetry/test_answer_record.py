"""Every dialect's answer reaches the request's record through ``serving``: formats asked, the id, the dimension."""
from __future__ import annotations

import ast
import json
import pathlib

import pytest

from poolgate.gateway import dialects
from tests.fakes import fake_model

MODEL = {"tasks": ("embed", "token_embed")}


@pytest.mark.parametrize("path, body, formats, dims", [
    ("/v1/embeddings", {"input": ["a b"], "encoding_format": "base64"}, ("base64",), 8),
    ("/v1/embeddings", {"input": ["a b"], "encoding_format": "bytes"}, ("bytes",), 8),
    ("/v1/embeddings", {"input": ["a b"], "embedding_types": ["multi_vector"]}, ("float",), None),
    ("/v2/embed", {"texts": ["a b"], "embedding_types": ["int8", "float"]}, ("int8", "float"), 8),
    ("/v1/embed", {"texts": ["a b"]}, ("float",), 8),
])
async def test_the_answer_is_recorded(recorded, path, body, formats, dims):
    client, records = await recorded(fake_model(**MODEL))
    resp = await client.post(path, json=body)
    assert resp.status == 200
    (record,) = records.records
    bytes_ = body.get("encoding_format") == "bytes"
    answered = json.loads(resp.headers["metadata"])["id"] if bytes_ else (await resp.json())["id"]
    assert record.response_id == answered and record.encoding_formats == formats
    assert record.dimension_count == dims


async def test_the_formats_asked_are_recorded_when_the_dialect_refuses(recorded):
    client, records = await recorded(fake_model(**MODEL))
    body = {"input": ["a b"], "late_chunking": True, "encoding_format": "bytes"}
    assert (await client.post("/v1/embeddings", json=body)).status == 400
    (record,) = records.records
    assert record.encoding_formats == ("bytes",) and record.response_id is None and record.task == "embed"


def test_no_dialect_writes_the_record():
    """The record's fields are written in ``gateway.serving`` only (its module doc)."""
    writes = []
    for path in pathlib.Path(dialects.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id in ("RECORD", "RequestRecord"):
                writes.append(f"{path.name}:{node.lineno}")
    assert writes == []
