"""One line of a batch job: OpenAI's batch JSONL, read and written.

Input, one request per line (OpenAI's Batch API and vLLM's ``run-batch``)::

    {"custom_id": "doc-1", "method": "POST", "url": "/v1/embeddings", "body": {...the route's request...}}

``custom_id`` is a non-empty string, unique within the job; ``method`` is
``POST``; ``url`` is one of ``URLS`` (the pooling routes of the OpenAI, vLLM
and Cohere dialects; a trailing slash or a query string is not accepted);
``body`` is the route's own request, checked by the route itself when the
line runs (so a line gets exactly the answer the same HTTP request would).

Output, one line per request (OpenAI's shape), in the order lines finish,
never in input order (as OpenAI's): a success goes to the output file::

    {"id": "batch_req_…", "custom_id": "doc-1",
     "response": {"status_code": 200, "request_id": "…", "body": {...the route's response...}},
     "error": null}

and a failure to the error file, with the route's own error answer when the
route answered and ``error`` = ``{"code", "message"}`` always (``code``: the
error body's ``type``/``code``, or ``invalid_request`` / ``duplicate_custom_id``
/ ``request_failed`` when no route answered; ``line``: the input line number).
A failed line that had no usable ``custom_id`` has ``custom_id`` null; its
``error.line`` names it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

# The routes a line may name: what the gateway serves for pooling models, by the dialects' own paths.
URLS = (
    "/v1/embeddings",
    "/pooling",
    "/classify",
    "/v1/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v2/embed",
)
MAX_CUSTOM_ID_CHARS = 512


@dataclass(frozen=True)
class Line:
    """One input line, well formed (its body is the route's to check)."""

    number: int  # 1-based line number in the input file
    custom_id: str
    url: str
    body: dict[str, Any]


class LineError(Exception):
    """An input line that cannot run: its number, its custom_id when it had one, an error code and message."""

    def __init__(self, number: int, message: str, *, custom_id: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.number, self.message, self.custom_id, self.code = number, message, custom_id, code


def parse_line(text: str | bytes, number: int, endpoint: str | None = None) -> Line:
    """The line ``number`` of an input file; ``LineError`` naming what is wrong. ``endpoint``: every line must
    name this url (a Batch API job's ``endpoint``)."""
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise LineError(number, f"line {number} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise LineError(number, f"line {number} is not a JSON object")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise LineError(
            number, f"line {number}: custom_id must be a non-empty string of at most {MAX_CUSTOM_ID_CHARS} characters"
        )
    method, url, body = obj.get("method"), obj.get("url"), obj.get("body")
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise LineError(number, f"line {number}: unknown field(s) {', '.join(unknown)}", custom_id=custom_id)
    if method != "POST":
        raise LineError(number, f"line {number}: method must be 'POST', got {method!r}", custom_id=custom_id)
    if url not in URLS:
        raise LineError(
            number,
            f"line {number}: url {url!r} is not a batch route; use one of {', '.join(URLS)}",
            custom_id=custom_id,
        )
    if endpoint is not None and url != endpoint:
        raise LineError(
            number, f"line {number}: url {url!r} differs from the batch's endpoint {endpoint!r}", custom_id=custom_id
        )
    if not isinstance(body, dict):
        raise LineError(number, f"line {number}: body must be a JSON object", custom_id=custom_id)
    return Line(number, custom_id, url, body)


def line_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def output_line(custom_id: str, status: int, request_id: str, body: Any) -> dict[str, Any]:
    """A line the route answered with 200."""
    return {
        "id": line_id(),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def error_line(
    number: int,
    custom_id: str | None,
    code: str,
    message: str,
    *,
    status: int | None = None,
    request_id: str | None = None,
    body: Any = None,
) -> dict[str, Any]:
    """A failed line: the route's answer when it gave one (``status``, ``request_id``, its error ``body``)."""
    response = None if status is None else {"status_code": status, "request_id": request_id, "body": body}
    return {
        "id": line_id(),
        "custom_id": custom_id,
        "response": response,
        "error": {"code": code, "message": message, "line": number},
    }


def error_of(status: int, body: Any) -> tuple[str, str]:
    """The (code, message) of a route's error answer, in any dialect's error shape (OpenAI's, TEI's, Cohere's)."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, str):  # TEI: {"error": message, "error_type": ...}
            kind = body.get("error_type")
            return kind if isinstance(kind, str) else f"http_{status}", err
        if isinstance(err, dict) and isinstance(err.get("message"), str):  # OpenAI / vLLM; Cohere's {"message"}
            codes = (err.get("code"), err.get("type"))
            return next((c for c in codes if isinstance(c, str)), f"http_{status}"), err["message"]
    return f"http_{status}", f"the route answered {status}"


def done_key(obj: dict[str, Any]) -> str | int | None:
    """What an output or error line marks as done: its custom_id, or (a line without one) its line number."""
    custom_id = obj.get("custom_id")
    if isinstance(custom_id, str):
        return custom_id
    err = obj.get("error")
    return err.get("line") if isinstance(err, dict) and isinstance(err.get("line"), int) else None


def dumps(obj: dict[str, Any]) -> bytes:
    """One JSONL line, newline included."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
