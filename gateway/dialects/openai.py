"""The OpenAI dialect: ``POST /v1/embeddings`` (vLLM's superset) and its pure request/response conversions.

The body is ``input`` (texts, token ids, or chat messages) or ``messages``
(one conversation or a list of them), plus vLLM's encoding fields:
``encoding_format`` float | base64 | bytes | bytes_only, ``embed_dtype`` and
``endianness`` (``dialects.encoding``). ``bytes`` answers
``application/octet-stream`` with the items back to back and a ``metadata``
header (JSON: id, created, model, each item's index, dtype, endianness,
byte range and shape, usage); ``bytes_only`` sends the same body without it.

A model whose active task is ``token_embed`` answers with one vector per
token (``[[float]]``), float only and without ``dimensions``, as vLLM's
token-embedding route does.
"""
from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field, model_validator

from poolgate.gateway.dialects.body import validation_failure
from poolgate.gateway.dialects.chat import ChatOptions, Conversation, chat_inputs, conversations
from poolgate.gateway.dialects.encoding import EmbedDType, EncodingFormat, Endianness, dumps, json_encoder
from poolgate.gateway.dialects.envelope import bytes_response, usage
from poolgate.gateway.dialects.request import CompletionInput, PoolingBody
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.serving import ServeRequest, Served, serve
from poolgate.gateway.state import RECORD, ROUTER
from poolgate.shared.errors import InvalidRequest
from poolgate.shared.params import PoolingParams
from poolgate.shared.wire import ModelInfo

ONE_OF = "Exactly one of `input` or `messages` must be given."


def _no_default(schema: dict) -> None:
    schema.pop("default", None)


class EmbeddingRequest(PoolingBody, ChatOptions):
    """The body of ``POST /v1/embeddings``; unknown fields are allowed and ignored."""

    # Either one, never null (a default is not validated, an explicit null is; nor is it documented).
    input: CompletionInput | Conversation | list[Conversation] = Field(None, json_schema_extra=_no_default)
    messages: Conversation | list[Conversation] = Field(None, json_schema_extra=_no_default)
    encoding_format: EncodingFormat = "float"
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"
    dimensions: int | None = None
    add_special_tokens: bool | None = None  # None: True for texts and ids, False for chat (vLLM's defaults)

    @model_validator(mode="before")
    @classmethod
    def _input_or_messages(cls, data: Any) -> Any:
        if isinstance(data, dict) and "input" not in data and "messages" not in data:
            raise validation_failure("1 validation error:\n  body.input: Field required [type=missing]",
                                     param="body.input")
        return data


class EmbeddingData(BaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | list[list[float]] | str


class EmbeddingResponse(BaseModel):
    """What a JSON (float or base64) answer holds."""

    id: str
    object: str = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: dict


def embed_task(info: ModelInfo) -> str:
    """vLLM's choice: the token-embedding route when the model's active task is token_embed."""
    return "token_embed" if info.tasks and info.tasks[0] == "token_embed" else "embed"


def to_request(req: EmbeddingRequest, task: str = "embed") -> ServeRequest:
    """The dialect-free request for ``req`` (server policy is applied by ``serving``)."""
    chat = _chat_value(req)
    if task == "token_embed":
        _check_token_embed(req)
    if chat is not None:
        inputs, special = chat_inputs(conversations(chat), req), False
    else:
        inputs, special = req.inputs(), True
    special = special if req.add_special_tokens is None else req.add_special_tokens
    params = PoolingParams(task=task, dimensions=req.dimensions, use_activation=req.use_activation,
                           add_special_tokens=special, **req.truncation())
    return ServeRequest(model=req.model, inputs=inputs, params=params)


def _chat_value(req: EmbeddingRequest):
    """The conversation(s) of a chat-style request, or None for a completion-style one."""
    if (req.input is None) == (req.messages is None):
        raise InvalidRequest(ONE_OF, param="input")
    if req.messages is not None:
        return req.messages
    value = req.input
    is_chat = isinstance(value, list) and value and not isinstance(value[0], (str, int)) and \
        (not isinstance(value[0], list) or (value[0] and not isinstance(value[0][0], int)))
    return value if is_chat else None


def _check_token_embed(req: EmbeddingRequest) -> None:
    if req.encoding_format != "float":
        raise validation_failure("1 validation error:\n  body.encoding_format: Input should be 'float' "
                                 "[type=literal_error]", param="body.encoding_format")
    if req.dimensions is not None:
        raise InvalidRequest("dimensions is currently not supported", param="dimensions")


def to_response(served: Served, *, encoding_format: str = "float", embed_dtype: str = "float32",
                endianness: str = "native", created: int) -> dict:
    """The embeddings response body; the call's one block of vectors is split into rows here."""
    encode, rows = json_encoder(encoding_format, embed_dtype, endianness), served.result.outputs
    data = [{"index": i, "object": "embedding", "embedding": encode(rows.item(i))} for i in range(len(rows))]
    return {"id": f"embd-{served.request_id}", "object": "list", "created": created,
            "model": served.info.served_model_name, "data": data, "usage": usage(served.result.total_tokens)}


async def create_embeddings(request: web.Request, req: EmbeddingRequest) -> web.Response:
    if (record := request.get(RECORD)) is not None:
        record.encoding_formats = (req.encoding_format,)
    task = embed_task(request.app[ROUTER].lookup(req.model).info)
    served = await serve(request, to_request(req, task))
    created, rows = int(time.time()), served.result.outputs
    if record is not None:
        record.response_id = f"embd-{served.request_id}"
        if len(rows):
            record.dimension_count = int(rows.item(0).shape[-1])
    if req.encoding_format in ("bytes", "bytes_only"):
        return bytes_response("embd", served, embed_dtype=req.embed_dtype, endianness=req.endianness,
                              created=created, with_metadata=req.encoding_format == "bytes")
    body = to_response(served, encoding_format=req.encoding_format, embed_dtype=req.embed_dtype,
                       endianness=req.endianness, created=created)
    return web.Response(body=dumps(body), content_type="application/json")


ROUTES = (Route("POST", "/v1/embeddings", create_embeddings, EmbeddingRequest, EmbeddingResponse,
                tasks=("embed", "token_embed"), summary="OpenAI embeddings (vLLM's superset)"),)
