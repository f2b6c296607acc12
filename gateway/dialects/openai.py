"""The OpenAI dialect: ``POST /v1/embeddings`` and its pure request/response conversions."""
from __future__ import annotations

import time
from typing import Literal

from aiohttp import web

from poolgate.gateway.dialects.encoding import ENCODERS, dumps
from poolgate.gateway.dialects.request import PoolingBody
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.serving import ServeRequest, Served, serve
from poolgate.gateway.state import RECORD
from poolgate.shared.params import PoolingParams

EncodingFormat = Literal["float", "base64"]


class EmbeddingRequest(PoolingBody):
    """The body of ``POST /v1/embeddings``; unknown fields are allowed and ignored."""

    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None


def to_request(req: EmbeddingRequest) -> ServeRequest:
    """The dialect-free request for ``req`` (server policy is applied by ``serving``)."""
    params = PoolingParams(task="embed", dimensions=req.dimensions, use_activation=req.use_activation,
                           truncate_prompt_tokens=req.truncate_prompt_tokens,
                           add_special_tokens=req.add_special_tokens)
    return ServeRequest(model=req.model, inputs=req.inputs(), params=params)


def to_response(served: Served, *, encoding_format: EncodingFormat, created: int) -> dict:
    """The embeddings response body; the call's one block of vectors is split into rows here."""
    encode = ENCODERS[encoding_format]
    rows, result = served.result.outputs, served.result
    data = [{"index": i, "object": "embedding", "embedding": encode(rows.item(i))} for i in range(len(rows))]
    usage = {"prompt_tokens": result.total_tokens, "total_tokens": result.total_tokens}
    return {"id": f"embd-{served.request_id}", "object": "list", "created": created,
            "model": served.info.served_model_name, "data": data, "usage": usage}


async def create_embeddings(request: web.Request, req: EmbeddingRequest) -> web.Response:
    if (record := request.get(RECORD)) is not None:
        record.encoding_formats = (req.encoding_format,)
    served = await serve(request, to_request(req))
    body = to_response(served, encoding_format=req.encoding_format, created=int(time.time()))
    if record is not None:
        record.response_id = body["id"]
        if len(served.result.outputs):
            record.dimension_count = int(served.result.outputs.item(0).shape[-1])
    return web.Response(body=dumps(body), content_type="application/json")


ROUTES = (Route("POST", "/v1/embeddings", create_embeddings, EmbeddingRequest, tasks=("embed", "token_embed"),
                summary="OpenAI embeddings"),)
