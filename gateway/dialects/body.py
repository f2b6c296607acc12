"""Read a JSON request body into a pydantic model, with vLLM's 400 messages."""

from __future__ import annotations

import json
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from poolgate.gateway.http.state import CONFIG
from poolgate.shared.domain.errors import InvalidRequest, RequestTooLarge

Model = TypeVar("Model", bound=BaseModel)

JSON_MEDIA_TYPE = "application/json"
MAX_LISTED_ERRORS = 5
MAX_INPUT_CHARS = 100  # a bad value is echoed, cut to this length (a whole input list is not)
VALIDATION_ERROR_TYPE = "Bad Request"  # vLLM answers pydantic failures with this type


async def parse_body(request: web.Request, model: type[Model]) -> Model:
    """The body as ``model``; InvalidRequest (400) for anything that is not one."""
    return validated(await read_json(request), model)


async def read_json(request: web.Request) -> object:
    """The body's JSON value; InvalidRequest (400) for another media type or malformed JSON, RequestTooLarge
    (413) for a body over ``--max-request-bytes``."""
    if request.content_type != JSON_MEDIA_TYPE:
        raise InvalidRequest("Unsupported Media Type: Only 'application/json' is allowed")
    return loads(await read_bytes(request))


async def read_bytes(request: web.Request) -> bytes:
    """The whole body; RequestTooLarge (413) for one over ``--max-request-bytes``."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[CONFIG].max_request_bytes
        raise RequestTooLarge(f"Request body too large: the limit is {limit} bytes (--max-request-bytes).") from None


def loads(raw: bytes | memoryview) -> object:
    """The JSON value of ``raw``; InvalidRequest (400) for malformed JSON."""
    try:
        return json.loads(raw if isinstance(raw, bytes) else bytes(raw))
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"Malformed JSON in request body: {_first_line(exc)}") from None


def validated(body: object, model: type[Model]) -> Model:
    """``body`` as ``model``; vLLM's 400 listing what is wrong."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


def validation_error(exc: ValidationError) -> InvalidRequest:
    """vLLM's shape: "N validation error(s):" then one line per error, with pydantic's error type and the
    value it got (``[type=literal_error, input_value='hex', input_type=str]``); param = first loc."""
    errors = exc.errors(include_url=False)
    n = len(errors)
    lines = [f"{n} validation error{'s' if n != 1 else ''}:"]
    for e in errors[:MAX_LISTED_ERRORS]:
        lines.append(f"  {_loc(e['loc'])}: {e['msg']} [type={e['type']}{_input(e)}]")
    if n > MAX_LISTED_ERRORS:
        lines.append(f"  ... and {n - MAX_LISTED_ERRORS} more")
    return validation_failure("\n".join(lines), param=_loc(errors[0]["loc"]) if errors else None)


def validation_failure(message: str, *, param: str | None) -> InvalidRequest:
    """A 400 for a body that does not validate; vLLM's ``type`` for these is "Bad Request"."""
    err = InvalidRequest(message, param=param)
    err.type = VALIDATION_ERROR_TYPE
    return err


def _input(error: ErrorDetails) -> str:
    """``, input_value=…, input_type=…`` as pydantic prints them (the value's repr cut to MAX_INPUT_CHARS)."""
    if "input" not in error or error["type"] == "missing":
        return ""
    value = repr(error["input"])
    if len(value) > MAX_INPUT_CHARS:
        value = value[: MAX_INPUT_CHARS // 2] + "..." + value[-MAX_INPUT_CHARS // 2 :]
    return f", input_value={value}, input_type={type(error['input']).__name__}"


def _loc(loc: tuple) -> str:
    return ".".join(str(part) for part in ("body", *loc))


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
