"""Every route of a live `poolgate serve` fuzzed from its own /openapi.json (schemathesis): never a 5xx, every
error body in the shape the document declares for the route's dialect, and the server healthy afterwards.

Each operation gets schemathesis' schema-valid (positive) and schema-breaking (negative) cases, plus raw
bodies no schema describes (broken JSON, bad UTF-8, the wrong top-level type, the wrong content type). The
default run sends a few hundred cases per server; the slow one a few thousand. Two servers: the bundled
embedder and a tiny random cross-encoder, so the classify routes are fuzzed too (a route is in the
document only while a served model serves its task).
"""
from __future__ import annotations

import collections
import json

import jsonschema
import pytest
import requests
from hypothesis import HealthCheck, Phase, errors, given, settings

from poolgate.shared.config.models import DEFAULT_MODEL_NAME
from tests.fakes import make_tiny_cross_encoder
from tests.live_server import live_server

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.generation.modes import GenerationMode  # noqa: E402

KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
RAW_BODIES = [(b"{", "application/json"), (b"[]", "application/json"), (b"null", "application/json"),
              (b'"text"', "application/json"), (b'{"input": "\xff\xfe"}', "application/json"),
              (b"", "application/json"), (b'{"input": "a"}', "text/plain"), (b"\x00" * 64, "application/octet-stream")]


# After the fuzz: a request that must still be answered, and what its answer must hold.
PROBES = {
    "embedder": ("/v1/embeddings",
                 {"model": DEFAULT_MODEL_NAME, "input": ["still answering"], "encoding_format": "float"},
                 lambda body: len(body["data"][0]["embedding"]) == 384),
    "cross_encoder": ("/rerank", {"query": "still", "documents": ["answering", "here"]},
                      lambda body: sorted(r["index"] for r in body["results"]) == [0, 1]),
}


@pytest.fixture(scope="module", params=["embedder", "cross_encoder"])
def server(request, tmp_path_factory):
    """The bundled embedder (the embed, score and TEI routes), or a tiny random cross-encoder (classify,
    predict and the cross-encoder's rerank and score)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "models").mkdir()  # an empty model root: the admin API is live, its loads find nothing
    model = []
    if request.param == "cross_encoder":
        make_tiny_cross_encoder(tmp / "cross-encoder")
        model = [str(tmp / "cross-encoder")]
    # The Batch API on too (its files, batches and their uploads fuzzed like every route).
    with live_server(tmp, *model, "--api-key", KEY, "--model-root", str(tmp / "models"),
                     "--batch-dir", str(tmp / "batches")) as live:
        yield live, PROBES[request.param]


class Tally:
    """What the fuzzer sent and what came back wrong."""

    def __init__(self, document: dict):
        self.document = document
        self.statuses: collections.Counter = collections.Counter()
        self.problems: list[str] = []

    def check(self, method: str, path: str, status: int, body: bytes, sent: object) -> None:
        self.statuses[status] += 1
        if status >= 500:
            self.problems.append(f"{status} {method} {path} sent={sent!r:.300} got={body[:300]!r}")
        elif status >= 400 and (why := self._shape_error(method, path, body)):
            self.problems.append(f"{status} {method} {path} body not in its dialect's shape ({why}): {body[:300]!r}")

    def _shape_error(self, method: str, path: str, body: bytes) -> str | None:
        declared = self.document["paths"][path][method.lower()]["responses"]["4XX"]["content"]["application/json"]
        schema = {**declared["schema"], "components": self.document["components"]}
        try:
            jsonschema.Draft202012Validator(schema).validate(json.loads(body))
        except (ValueError, jsonschema.ValidationError) as err:
            return str(err).splitlines()[0][:200]
        return None


def _fuzz_operation(op, url: str, tally: Tally, n: int) -> None:
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        def send(case):
            r = case.call(base_url=url, headers=AUTH, timeout=60)
            tally.check(op.method, op.path, r.status_code, r.content, (case.path_parameters, case.query, case.body))

        try:
            send()
        except errors.Unsatisfiable:  # nothing to break: the operation takes no parameters and no body
            assert mode is GenerationMode.NEGATIVE and "requestBody" not in op.definition.raw, op.label


def _raw_bodies(url: str, document: dict, tally: Tally) -> None:
    for path, methods in document["paths"].items():
        if "post" not in methods or "{" in path:
            continue
        for body, content_type in RAW_BODIES:
            r = requests.post(f"{url}{path}", data=body, headers={**AUTH, "Content-Type": content_type}, timeout=60)
            tally.check("POST", path, r.status_code, r.content, body)


def _assert_healthy(server, probe, workers_before: list[int]) -> None:
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
    path, body, holds = probe
    r = requests.post(f"{server.url}{path}", headers=AUTH, timeout=60, json=body)
    assert r.status_code == 200 and holds(r.json()), r.text
    assert sorted(server.workers()) == sorted(workers_before), "a worker died (and was replaced) during the fuzz"
    assert "Traceback" not in server.log_text(), server.log_text()[-3000:]


@pytest.mark.parametrize("n, at_least", [(5, 200), pytest.param(70, 2500, marks=pytest.mark.slow)])
def test_fuzz_every_route_from_openapi(server, n, at_least):
    server, probe = server
    document = requests.get(f"{server.url}/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    workers_before = server.workers()
    assert workers_before
    tally = Tally(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /rerank", "POST /tokenize", "DELETE /admin/models/{name}", "POST /v1/files",
        "POST /v1/batches/{batch_id}/cancel"}
    for op in operations:
        _fuzz_operation(op, server.url, tally, n)
    _raw_bodies(server.url, document, tally)
    sent = sum(tally.statuses.values())
    print(f"fuzz: {sent} cases over {len(operations)} operations, statuses {dict(sorted(tally.statuses.items()))}")
    assert not tally.problems, "\n".join(tally.problems[:30])
    assert sent >= at_least  # the fuzzer really ran
    _assert_healthy(server, probe, workers_before)
