"""vLLM's response envelopes: the list body ``{id, object: "list", created, model, data, usage}`` and the
``bytes`` / ``bytes_only`` answer (items' raw bytes back to back, with or without a ``metadata`` header).

``list_response`` is the one place a list body is built: every ``/v1/embeddings`` answer (float, base64,
``embedding_types``, late chunks, token_embed) and the ``bytes`` metadata are it, as are ``/pooling``'s,
``/classify``'s and ``/score``'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel

from poolgate.gateway.dialects.encoding import bytes_items, dumps
from poolgate.gateway.serving import Served

EMBEDDINGS = "embd"  # the id prefix of an embeddings answer, as vLLM's


class Usage(BaseModel):
    """vLLM's ``UsageInfo`` (documents the ``usage`` of the list responses)."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None
    completion_tokens_details: None = None


def usage(prompt_tokens: int) -> dict:
    """vLLM's ``UsageInfo`` as it dumps it: pooling has no completion tokens."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def response_id(prefix: str, served: Served) -> str:
    """A response's id, ``{prefix}-{request id}``, as vLLM makes it."""
    return f"{prefix}-{served.request_id}"


def list_response(prefix: str, served: Served, data: list[dict], *, created: int) -> dict:
    """The body around ``data``; its id is ``response_id(prefix, served)``."""
    return {
        "id": response_id(prefix, served),
        "object": "list",
        "created": created,
        "model": served.info.served_model_name,
        "data": data,
        "usage": usage(served.result.total_tokens),
    }


def bytes_metadata(prefix: str, served: Served, items: list[dict], *, created: int) -> dict:
    """vLLM's ``metadata`` header: the list body around the items' byte ranges, without ``object`` and with
    the token counts only in its ``usage``."""
    body = list_response(prefix, served, items, created=created)
    del body["object"]
    body["usage"] = {key: body["usage"][key] for key in ("prompt_tokens", "total_tokens")}
    return body


def bytes_response(
    prefix: str, served: Served, *, embed_dtype: str, endianness: str, created: int, with_metadata: bool
) -> web.Response:
    """``application/octet-stream``: each item's ``embed_dtype`` codes; ``bytes`` adds the ``metadata``
    header (JSON: id, created, model, each item's index, dtype, endianness, byte range and shape, usage)."""
    rows = served.result.outputs
    body, items = bytes_items([rows.item(i) for i in range(len(rows))], embed_dtype, endianness)
    headers = {}
    if with_metadata:
        headers["metadata"] = orjson.dumps(bytes_metadata(prefix, served, items, created=created)).decode()
    return web.Response(body=body, headers=headers, content_type="application/octet-stream")


def encoded_response(
    prefix: str,
    served: Served,
    *,
    encoding_format: str,
    embed_dtype: str,
    endianness: str,
    created: int,
    to_json: Callable[..., dict[str, Any]],
) -> web.Response:
    """The answer of a route whose arrays are encoded as asked: ``bytes`` / ``bytes_only`` as above, else
    the route's JSON body, ``to_json(served, encoding_format=, embed_dtype=, endianness=, created=)``."""
    if encoding_format in ("bytes", "bytes_only"):
        return bytes_response(
            prefix,
            served,
            embed_dtype=embed_dtype,
            endianness=endianness,
            created=created,
            with_metadata=encoding_format == "bytes",
        )
    body = to_json(
        served, encoding_format=encoding_format, embed_dtype=embed_dtype, endianness=endianness, created=created
    )
    return web.Response(body=dumps(body), content_type="application/json")
