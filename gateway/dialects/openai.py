"""The OpenAI dialect: ``POST /v1/embeddings`` and its pure request/response conversions."""
from __future__ import annotations

import time
from typing import Annotated, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from poolgate.gateway.dialects.body import parse_body
from poolgate.gateway.dialects.encoding import ENCODERS, dumps
from poolgate.gateway.serving import ServeRequest, Served, serve
from poolgate.gateway.state import RECORD
from poolgate.shared.errors import InvalidRequest
from poolgate.shared.params import PoolingParams
from poolgate.shared.wire import Input

# Strict, so "1" is not a token id and 1 is not a text; ids fit an int32 vocabulary.
TokenId = Annotated[StrictInt, Field(ge=0, lt=2**31)]
EmbeddingInput = StrictStr | list[StrictStr] | list[TokenId] | list[list[TokenId]]
EncodingFormat = Literal["float", "base64"]

# vLLM's reject_removed_pooling_parameters: name -> message.
REMOVED_PARAMS: dict[str, str] = {
    "normalize": "Parameter `normalize` was removed; use `use_activation` instead.",
}


class EmbeddingRequest(BaseModel):
    """The body of ``POST /v1/embeddings``; unknown fields are allowed and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: EmbeddingInput
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    use_activation: bool | None = None


def to_request(req: EmbeddingRequest) -> ServeRequest:
    """The dialect-free request for ``req`` (server policy is applied by ``serving``)."""
    for name, message in REMOVED_PARAMS.items():
        if name in (req.model_extra or {}):
            raise InvalidRequest(message, param=name)
    params = PoolingParams(task="embed", dimensions=req.dimensions, use_activation=req.use_activation,
                           truncate_prompt_tokens=req.truncate_prompt_tokens)
    return ServeRequest(model=req.model, inputs=_inputs(req.input), params=params)


def _inputs(value: str | list) -> list[Input]:
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [list(value)]
    return list(value)


def to_response(served: Served, *, encoding_format: EncodingFormat, created: int) -> dict:
    """The embeddings response body; the call's one block of vectors is split into rows here."""
    encode = ENCODERS[encoding_format]
    rows, result = served.result.outputs, served.result
    data = [{"index": i, "object": "embedding", "embedding": encode(rows.item(i))} for i in range(len(rows))]
    usage = {"prompt_tokens": result.total_tokens, "total_tokens": result.total_tokens}
    return {"id": f"embd-{served.request_id}", "object": "list", "created": created,
            "model": served.info.served_model_name, "data": data, "usage": usage}


async def create_embeddings(request: web.Request) -> web.Response:
    req = await parse_body(request, EmbeddingRequest)
    if (record := request.get(RECORD)) is not None:
        record.encoding_formats = (req.encoding_format,)
    served = await serve(request, to_request(req))
    body = to_response(served, encoding_format=req.encoding_format, created=int(time.time()))
    if record is not None:
        record.response_id = body["id"]
        if len(served.result.outputs):
            record.dimension_count = int(served.result.outputs.item(0).shape[-1])
    return web.Response(body=dumps(body), content_type="application/json")


def register(app: web.Application) -> None:
    app.router.add_post("/v1/embeddings", create_embeddings)
