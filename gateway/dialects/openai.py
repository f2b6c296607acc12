"""The OpenAI dialect: ``POST /v1/embeddings`` and its pure request/response conversions."""
from __future__ import annotations

import time
from typing import Annotated, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from poolgate.gateway.dialects.body import parse_body
from poolgate.gateway.dialects.encoding import ENCODERS, dumps
from poolgate.gateway.state import CONFIG, REQUEST_ID, ROUTER
from poolgate.shared.config import GatewayConfig
from poolgate.shared.errors import InvalidRequest
from poolgate.shared.params import PoolingParams
from poolgate.shared.wire import Input, PoolingCall, PoolingResult

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


def to_call(req: EmbeddingRequest, *, request_id: str, model: str, config: GatewayConfig,
            now: float) -> PoolingCall:
    """The dialect-free call for ``req`` under the server's policy: ``auto_truncate`` turns
    no truncation into -1, the request timeout becomes the deadline, inputs are capped."""
    for name, message in REMOVED_PARAMS.items():
        if name in (req.model_extra or {}):
            raise InvalidRequest(message, param=name)
    truncate = req.truncate_prompt_tokens
    if truncate is None and config.auto_truncate:
        truncate = -1
    params = PoolingParams(
        task="embed", dimensions=req.dimensions, use_activation=req.use_activation,
        truncate_prompt_tokens=truncate,
    )
    timeout = config.request_timeout_s
    return PoolingCall(request_id=request_id, model=model, inputs=_inputs(req.input, config.max_inputs_per_request),
                       params=params, deadline=None if timeout is None else now + timeout)


def _inputs(value: str | list, limit: int) -> list[Input]:
    if isinstance(value, str):
        return [value]
    if not value:
        raise InvalidRequest("You must pass at least one prompt", param="input")
    if isinstance(value[0], int):
        return [list(value)]
    if len(value) > limit:
        raise InvalidRequest(f"Too many inputs: {len(value)} in one request; the limit is {limit}.", param="input")
    return list(value)


def to_response(result: PoolingResult, *, request_id: str, model: str,
                encoding_format: EncodingFormat, created: int) -> dict:
    """The embeddings response body; vectors are encoded straight from their arrays."""
    encode = ENCODERS[encoding_format]
    data = [
        {"index": i, "object": "embedding", "embedding": encode(vector)}
        for i, vector in enumerate(result.outputs)
    ]
    usage = {"prompt_tokens": result.total_tokens, "total_tokens": result.total_tokens}
    return {"id": f"embd-{request_id}", "object": "list", "created": created, "model": model,
            "data": data, "usage": usage}


async def create_embeddings(request: web.Request) -> web.Response:
    req = await parse_body(request, EmbeddingRequest)
    pool = request.app[ROUTER].resolve(req.model, "embed")
    request_id = request[REQUEST_ID]
    call = to_call(req, request_id=request_id, model=pool.name, config=request.app[CONFIG], now=time.time())
    result = await pool.submit(call)
    body = to_response(result, request_id=request_id, model=pool.name,
                       encoding_format=req.encoding_format, created=int(time.time()))
    return web.Response(body=dumps(body), content_type="application/json")


def register(app: web.Application) -> None:
    app.router.add_post("/v1/embeddings", create_embeddings)
