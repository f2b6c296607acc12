"""``/v1/embeddings``' ``embedding_types`` extension: dense, sparse and multi-vector outputs in one response.

``embedding_types`` (poolgate's; default ``["dense"]``, which is the plain
OpenAI answer) lists the outputs each item carries:

- ``dense``: ``embedding``, as ``encoding_format`` asks (float or base64);
- ``sparse``: ``sparse_embedding: {indices, values}`` (and ``tokens``, the
  token strings, with ``return_tokens``) from the model's sparse head
  (``dialects.sparse_serving``: SPLADE, BGE-M3; 400 for a model without one);
- ``multi_vector``: ``multi_vector: [[float]]``, one vector per token
  (``token_embed``: BGE-M3's ColBERT vectors, a ColBERT model's), floats
  whatever ``encoding_format`` (written from the array by ``dumps``, as
  ``dialects.encoding.to_double_list``).

``dimensions`` applies to the dense output only (a 400 without it).

BGE-M3 answers all three for the same inputs in one request: the outputs go
to the worker as one multi-output call (``PoolingParams.outputs``), so each
input runs one forward whose hidden states feed every asked head, and the call
answers one block per output; usage counts the inputs' tokens once. A
multi-output call's inputs run whole (up to ``max_model_len``, never chunked).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from aiohttp import web

from poolgate.gateway.dialects.encoding import dumps, json_encoder, to_double_list
from poolgate.gateway.dialects.envelope import EMBEDDINGS, list_response
from poolgate.gateway.dialects.sparse_serving import sparse_request
from poolgate.gateway.http.state import CONFIG
from poolgate.gateway.serving import ServeRequest, serve, with_policy
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.sparse import sparse_vector
from poolgate.shared.wire.messages import ModelInfo

EmbeddingType = Literal["dense", "sparse", "multi_vector"]
JSON_FORMATS = ("float", "base64")


def plain(types: Sequence[str] | None) -> bool:
    """Whether the request asks for the plain OpenAI answer (dense only)."""
    return types is None or list(dict.fromkeys(types)) == ["dense"]


def check(types: list[str], info: ModelInfo, encoding_format: str, return_tokens: bool, dimensions: int | None) -> None:
    if encoding_format not in JSON_FORMATS:
        raise InvalidRequest(
            f"embedding_types {types} answer JSON: encoding_format must be float or base64, not {encoding_format!r}",
            param="encoding_format",
        )
    if dimensions is not None and "dense" not in types:
        raise InvalidRequest(
            'dimensions applies to dense embeddings: add "dense" to embedding_types', param="dimensions"
        )
    if return_tokens and "sparse" not in types:
        raise InvalidRequest("return_tokens applies to sparse embeddings", param="return_tokens")
    if "multi_vector" in types and "token_embed" not in info.tasks:
        raise InvalidRequest(
            f"Model '{info.served_model_name}' has no multi-vector output (task 'token_embed').",
            param="embedding_types",
        )


async def respond(
    request: web.Request,
    info: ModelInfo,
    base: ServeRequest,
    types: Sequence[str],
    *,
    encoding_format: str,
    embed_dtype: str,
    endianness: str,
    return_tokens: bool,
) -> dict:
    """The response body with every asked output per item."""
    types = list(dict.fromkeys(types))
    check(types, info, encoding_format, return_tokens, base.params.dimensions)
    base = replace(base, params=with_policy(request.app[CONFIG], base.params))  # every output tokenizes alike
    params = [output_params(info, base, kind, return_tokens) for kind in types]
    served = await serve(request, replace(base, params=replace(params[0], outputs=tuple(params[1:]))))
    answers = dict(zip(types, [served.result, *served.result.more], strict=True))
    data = [{"index": i, "object": "embedding"} for i in range(len(base.inputs))]
    if "dense" in answers:
        encode, rows = json_encoder(encoding_format, embed_dtype, endianness), answers["dense"].outputs
        for i, item in enumerate(data):
            item["embedding"] = encode(rows.item(i))
    if "sparse" in answers:
        rows, tokens = answers["sparse"].outputs, answers["sparse"].tokens
        for i, item in enumerate(data):
            item["sparse_embedding"] = sparse_vector(rows, i, tokens).to_json()
    if "multi_vector" in answers:
        rows = answers["multi_vector"].outputs
        for i, item in enumerate(data):
            item["multi_vector"] = to_double_list(rows.item(i))
    return list_response(EMBEDDINGS, served, data, created=int(time.time()))


def output_params(info: ModelInfo, base: ServeRequest, kind: str, return_tokens: bool) -> PoolingParams:
    """The params of one asked output of ``base``'s inputs (``base`` is the dense request)."""
    if kind == "sparse":
        return sparse_request(info, base, return_tokens=return_tokens).params
    if kind == "multi_vector":
        return replace(base.params, task="token_embed", dimensions=None)
    return base.params


def json_response(body: dict) -> web.Response:
    return web.Response(body=dumps(body), content_type="application/json")
