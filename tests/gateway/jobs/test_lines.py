"""The batch line format: what parses, what each bad line says, the shapes written and read back."""
from __future__ import annotations

import json

import pytest

from poolgate.gateway.jobs.lines import (
    LineError,
    done_key,
    dumps,
    error_line,
    error_of,
    output_line,
    parse_line,
)


def line(**fields) -> str:
    base = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


def test_a_good_line():
    parsed = parse_line(line(), 7)
    assert (parsed.number, parsed.custom_id, parsed.url, parsed.body) == (7, "a", "/v1/embeddings", {"input": "x"})


@pytest.mark.parametrize(
    ("text", "says", "custom_id"),
    [
        ("{not json", "not valid JSON", None),
        ("[1, 2]", "not a JSON object", None),
        (line(custom_id=...), "custom_id must be a non-empty string", None),
        (line(custom_id=""), "custom_id must be a non-empty string", None),
        (line(custom_id=3), "custom_id must be a non-empty string", None),
        (line(custom_id="x" * 513), "custom_id must be a non-empty string", None),
        (line(method="GET"), "method must be 'POST'", "a"),
        (line(url="/v1/chat/completions"), "is not a batch route", "a"),
        (line(url="/v1/embeddings/"), "is not a batch route", "a"),
        (line(body=[1]), "body must be a JSON object", "a"),
        (line(extra=1), "unknown field(s) extra", "a"),
    ],
)
def test_each_bad_line_says_what_is_wrong(text, says, custom_id):
    with pytest.raises(LineError) as caught:
        parse_line(text, 3)
    assert says in caught.value.message and caught.value.message.startswith("line 3")
    assert caught.value.custom_id == custom_id and caught.value.number == 3


def test_a_batch_endpoint_binds_every_line():
    assert parse_line(line(url="/score"), 1, endpoint="/score").url == "/score"
    with pytest.raises(LineError, match="differs from the batch's endpoint '/v1/embeddings'"):
        parse_line(line(url="/score"), 1, endpoint="/v1/embeddings")


def test_written_lines_are_read_back_by_their_keys():
    ok = json.loads(dumps(output_line("doc-1", 200, "req", {"data": []})))
    assert ok["id"].startswith("batch_req_") and ok["error"] is None
    assert ok["response"] == {"status_code": 200, "request_id": "req", "body": {"data": []}}
    assert done_key(ok) == "doc-1"
    failed = json.loads(dumps(error_line(9, None, "invalid_request", "bad")))
    assert failed["response"] is None and failed["error"] == {"code": "invalid_request", "message": "bad", "line": 9}
    assert done_key(failed) == 9
    routed = error_line(2, "b", "BadRequestError", "no", status=400, request_id="r", body={"error": {}})
    assert routed["response"]["status_code"] == 400 and done_key(routed) == "b"


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, {"error": {"message": "m", "type": "BadRequestError", "param": None, "code": 400}},
         ("BadRequestError", "m")),
        (422, {"error": "bad input", "error_type": "Validation"}, ("Validation", "bad input")),
        (400, {"message": "cohere says"}, ("http_400", "cohere says")),
        (500, None, ("http_500", "the route answered 500")),
    ],
)
def test_error_of_reads_every_dialects_error_shape(status, body, expected):
    assert error_of(status, body) == expected
