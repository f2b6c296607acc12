"""The lane end to end: X-Poolgate-Lane sets the call's lane from the gateway to the worker's queued sequences,
and a value that is not live or bulk is a 400 naming the header (the app over a real fake-model worker)."""
from __future__ import annotations

import pytest

from poolgate.gateway.serving import LANE_HEADER, lane
from poolgate.shared.domain.errors import InvalidRequest
from tests.fakes import fake_model

EMBED = "/v1/embeddings"


def test_the_header_names_the_lane_and_nothing_else_is_one():
    assert LANE_HEADER == "X-Poolgate-Lane"
    assert lane(None) == "live" and lane("live") == "live" and lane("bulk") == "bulk" and lane(" Bulk ") == "bulk"
    for bad in ("", "batch", "low", "bulk,live"):
        with pytest.raises(InvalidRequest, match=f"{LANE_HEADER} must be one of live, bulk, got {bad!r}"):
            lane(bad)


async def test_the_header_sets_the_lane_of_the_sequences_the_worker_runs(gateway):
    model = fake_model()
    client = await gateway(models=[model])
    for headers, want in (({LANE_HEADER: "bulk"}, "bulk"), ({}, "live"), ({LANE_HEADER: "live"}, "live")):
        resp = await client.post(EMBED, json={"input": ["a b", "c"]}, headers=headers)
        assert resp.status == 200
        assert [s.lane for s in model.runner.batches[-1]] == [want, want]
    body = {"model": "fake-model", "texts": ["a"], "input_type": "search_document", "embedding_types": ["float"]}
    resp = await client.post("/v2/embed", json=body, headers={LANE_HEADER: "bulk"})  # every dialect: one path
    assert resp.status == 200 and [s.lane for s in model.runner.batches[-1]] == ["bulk"]


async def test_a_bad_lane_is_a_400_naming_the_header_and_nothing_runs(gateway):
    model = fake_model()
    client = await gateway(models=[model])
    resp = await client.post(EMBED, json={"input": "x"}, headers={LANE_HEADER: "urgent"})
    body = await resp.json()
    assert resp.status == 400 and LANE_HEADER in body["error"]["message"] and model.runner.batches == []
    resp = await client.post("/tokenize", json={"prompt": "x"}, headers={LANE_HEADER: "urgent"})
    assert resp.status == 400 and LANE_HEADER in (await resp.json())["error"]["message"]
