"""Every route of a live `poolgate serve` fuzzed from its own /openapi.json (schemathesis): never a 5xx, every
error body in the shape the document declares for the route's dialect, and the server healthy afterwards.

Each operation gets schemathesis' schema-valid (positive) and schema-breaking (negative) cases, plus raw
bodies no schema describes (broken JSON, bad UTF-8, the wrong top-level type, the wrong content type). The
default run sends a few hundred cases per server; the slow one a few thousand. Three servers: the bundled
embedder, a tiny random cross-encoder, so the classify routes are fuzzed too (a route is in the
document only while a served model serves its task), and a tiny random CLIP, which also gets bodies of random
content parts (images real, corrupt, truncated or huge; bad data URLs; wrong types) on every route that takes them.
"""
from __future__ import annotations

import base64
import collections
import json
import random
import struct
import zlib

import jsonschema
import pytest
import requests
from hypothesis import HealthCheck, Phase, errors, given, settings

from poolgate.shared.config.models import DEFAULT_MODEL_NAME
from tests.fakes import make_tiny_cross_encoder
from tests.gateway.dialects.test_dialect_fuzz import media_body
from tests.live_server import live_server
from tests.workers.media.dual_encoders import make_dual, png

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
    "clip": ("/v1/embeddings", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png(0)).decode()}}]}]},
             lambda body: len(body["data"][0]["embedding"]) == 24),
}
MEDIA_ROUTES = ["/v1/embeddings", "/pooling", "/v2/embed", "/score", "/rerank"]


@pytest.fixture(scope="module", params=["embedder", "cross_encoder", "clip"])
def server(request, tmp_path_factory):
    """The bundled embedder (the embed, score and TEI routes), or a tiny random cross-encoder (classify,
    predict and the cross-encoder's rerank and score)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "models").mkdir()  # an empty model root: the admin API is live, its loads find nothing
    model = []
    if request.param == "cross_encoder":
        make_tiny_cross_encoder(tmp / "cross-encoder")
        model = [str(tmp / "cross-encoder")]
    elif request.param == "clip":
        make_dual(tmp / "clip", "clip")
        model = [str(tmp / "clip")]
    # The Batch API on too (its files, batches and their uploads fuzzed like every route).
    with live_server(tmp, *model, "--api-key", KEY, "--model-root", str(tmp / "models"),
                     "--batch-dir", str(tmp / "batches")) as live:
        yield live, (request.param, PROBES[request.param])


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


def image_urls(rng: random.Random) -> list[str]:
    """A real image, and the same bytes corrupt or truncated, and a PNG header claiming 30,000 x 30,000 pixels."""
    fmt = rng.choice(["PNG", "JPEG", "GIF", "WEBP"])
    good = png(rng.randrange(100), rng.randint(1, 80), rng.randint(1, 80), fmt)
    flipped = bytearray(good)
    for _ in range(8):
        flipped[rng.randrange(len(flipped))] ^= 0xFF
    small = png(0, 4, 4)
    ihdr = struct.pack(">II", 30000, 30000) + small[24:29]  # IHDR's width and height, its CRC made right
    bomb = small[:16] + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)) + small[33:]
    cut = good[: rng.randrange(1, len(good))]
    return ["data:image/png;base64," + base64.b64encode(x).decode() for x in (good, bytes(flipped), cut, bomb)]


def _media_bodies(url: str, tally: Tally, n: int) -> None:
    """Random content parts (tests.gateway.dialects.test_dialect_fuzz) with real, corrupt, truncated and huge images
    in their URLs, on every route that reads them."""
    rng = random.Random(0)
    for i in range(n):
        path = MEDIA_ROUTES[i % len(MEDIA_ROUTES)]
        body = json.loads(json.dumps(media_body(path, rng)))
        urls = image_urls(rng)
        text = json.dumps(body)
        for placeholder in ("data:image/png;base64,iVBORw0KGgo=", "iVBORw0KGgo="):
            text = text.replace(json.dumps(placeholder), json.dumps(rng.choice(urls)))
        r = requests.post(f"{url}{path}", data=text, headers={**AUTH, "Content-Type": "application/json"}, timeout=60)
        tally.check("POST", path, r.status_code, r.content, text[:300])


def _assert_healthy(server, probe, workers_before: list[int]) -> None:
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
    path, body, holds = probe
    r = requests.post(f"{server.url}{path}", headers=AUTH, timeout=60, json=body)
    assert r.status_code == 200 and holds(r.json()), r.text
    assert sorted(server.workers()) == sorted(workers_before), "a worker died (and was replaced) during the fuzz"
    assert "Traceback" not in server.log_text(), server.log_text()[-3000:]


@pytest.mark.parametrize("n, at_least", [(5, 200), pytest.param(70, 2500, marks=pytest.mark.slow)])
def test_fuzz_every_route_from_openapi(server, n, at_least):
    server, (kind, probe) = server
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
    if kind == "clip":
        _media_bodies(server.url, tally, n * 40)
    sent = sum(tally.statuses.values())
    print(f"fuzz: {sent} cases over {len(operations)} operations, statuses {dict(sorted(tally.statuses.items()))}")
    assert not tally.problems, "\n".join(tally.problems[:30])
    assert sent >= at_least  # the fuzzer really ran
    _assert_healthy(server, probe, workers_before)
