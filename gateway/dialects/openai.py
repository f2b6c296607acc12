"""The OpenAI dialect: ``POST /v1/embeddings`` (vLLM's superset) and its pure request/response conversions.

The body is ``input`` (texts, token ids, chat messages, or Jina's
``[{"text": ...} | {"image": URL or base64}]`` objects, one vector each) or
``messages`` (one conversation or a list of them; their content parts may hold
images and audio, ``dialects.chat``), plus vLLM's encoding fields:
``encoding_format`` float | base64 | bytes | bytes_only, ``embed_dtype`` and
``endianness`` (``dialects.encoding``). ``bytes`` answers
``application/octet-stream`` with the items back to back and a ``metadata``
header (JSON: id, created, model, each item's index, dtype, endianness,
byte range and shape, usage); ``bytes_only`` sends the same body without it.

``embedding_types`` (``dense``, ``sparse``, ``multi_vector``) and
``return_tokens`` are poolgate's extension for sparse and multi-vector
outputs (``dialects.openai_outputs``); ``late_chunking`` (Jina's, with
``chunk_boundaries`` or ``chunk_size``) a vector per chunk of one encoded
document (``dialects.late_chunking``).

``input_type`` (Cohere's name) or ``prompt_name`` (TEI's) prefix each text
with one of the model's prompts, as sentence-transformers does
(``dialects.prompts``: Cohere's four standard types are always accepted); for a
model with input roles (PyLate ColBERT) ``input_type`` also says whether the
inputs are queries or documents, and is required (``dialects.roles``).

A model whose active task is ``token_embed`` answers with one vector per
token (``[[float]]``), float only and without ``dimensions``, as vLLM's
token-embedding route does.
"""

from __future__ import annotations

import time

from aiohttp import web
from pydantic import BaseModel, Field

from poolgate.gateway.dialects import late_chunking as late
from poolgate.gateway.dialects import openai_outputs as outputs
from poolgate.gateway.dialects.body import validation_failure
from poolgate.gateway.dialects.chat import Conversation, EncodedBody, no_default
from poolgate.gateway.dialects.encoding import json_encoder
from poolgate.gateway.dialects.envelope import EMBEDDINGS, Usage, encoded_response, list_response, response_id
from poolgate.gateway.dialects.pairs import ImageObject, TextObject
from poolgate.gateway.dialects.prompts import prompted
from poolgate.gateway.dialects.request import CompletionInput
from poolgate.gateway.dialects.roles import query_inputs, role_prompt
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.http.state import ROUTER
from poolgate.gateway.serving import Served, ServeRequest, record_answer, serve
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.tasks import PoolingTask
from poolgate.shared.wire.media import IMAGE, MediaInput, MediaRef
from poolgate.shared.wire.messages import Input, ModelInfo


class EmbeddingRequest(EncodedBody):
    """The body of ``POST /v1/embeddings``; unknown fields are allowed and ignored."""

    # Jina's objects as well (jina-clip's texts and images in one list)
    input: CompletionInput | Conversation | list[Conversation] | list[TextObject | ImageObject] = Field(  # type: ignore[assignment]
        None, json_schema_extra=no_default
    )

    input_type: str | None = None  # poolgate: a per-request prompt (dialects.prompts), as Cohere's field
    prompt_name: str | None = None  # poolgate: the same by the model's prompt name, as TEI's field
    embedding_types: list[outputs.EmbeddingType] | None = None  # poolgate: dense, sparse, multi_vector (openai_outputs)
    return_tokens: bool = False  # poolgate: sparse embeddings name their tokens too
    late_chunking: bool = False  # Jina's: one document encoded once, a vector per chunk (dialects.late_chunking)
    chunk_boundaries: list[int] | None = None  # late chunking: where chunks start (characters)
    chunk_size: int | None = None  # late chunking: tokens per chunk
    task: str | None = None  # Jina's: the task adapter the forward runs with (ModelInfo.adapters; shared.domain.limits)

    def inputs(self) -> list[Input]:
        """``input`` as inputs: Jina's objects as texts and one-image ``MediaInput``s, others as vLLM reads them."""
        if isinstance(self.input, list) and self.input and isinstance(self.input[0], TextObject | ImageObject):
            return [
                x.text if isinstance(x, TextObject) else MediaInput(parts=(MediaRef(IMAGE, url=x.image),))
                for x in self.input
                if isinstance(x, TextObject | ImageObject)
            ]
        return super().inputs()


class EmbeddingData(BaseModel):
    index: int
    object: str = "embedding"
    embedding: list[float] | list[list[float]] | str | None = None  # absent when embedding_types leaves dense out
    chunk: dict | None = None  # late_chunking: {document, start, end}
    sparse_embedding: dict | None = None  # embedding_types "sparse": {indices, values[, tokens]}
    multi_vector: list[list[float]] | None = None  # embedding_types "multi_vector"


class EmbeddingResponse(BaseModel):
    """What a JSON (float or base64) answer holds."""

    id: str
    object: str = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: Usage


def embed_task(info: ModelInfo) -> PoolingTask:
    """vLLM's choice: the token-embedding route when the model's active task is token_embed."""
    return "token_embed" if info.tasks and info.tasks[0] == "token_embed" else "embed"


def to_request(req: EmbeddingRequest, task: PoolingTask = "embed", info: ModelInfo | None = None) -> ServeRequest:
    """The dialect-free request for ``req`` (server policy is applied by ``serving``); ``info`` (the
    model's) is needed only for a request that names a prompt."""
    if task == "token_embed":
        _check_token_embed(req)
    inputs, special = req.call_inputs(info)
    if req.input_type is not None or req.prompt_name is not None:
        if info is None:
            raise ValueError("a request that names a prompt is converted with its model's info")
        inputs = prompted(inputs, role_prompt(info, req.input_type, req.prompt_name))
    params = PoolingParams(
        task=task,
        dimensions=req.dimensions,
        use_activation=req.use_activation,
        add_special_tokens=special,
        query_inputs=query_inputs(info, req.input_type, len(inputs)),
        adapter=req.task,
        **req.truncation(),
    )
    return ServeRequest(model=req.model, inputs=inputs, params=params, priority=req.priority)


def _check_token_embed(req: EmbeddingRequest) -> None:
    if req.encoding_format != "float":
        raise validation_failure(
            "1 validation error:\n  body.encoding_format: Input should be 'float' [type=literal_error]",
            param="body.encoding_format",
        )
    if req.dimensions is not None:
        raise InvalidRequest("dimensions is currently not supported", param="dimensions")


def to_response(
    served: Served,
    *,
    encoding_format: str = "float",
    embed_dtype: str = "float32",
    endianness: str = "native",
    created: int,
) -> dict:
    """The embeddings response body; the call's one block of vectors is split into rows here."""
    encode, rows = json_encoder(encoding_format, embed_dtype, endianness), served.result.outputs
    data = [{"index": i, "object": "embedding", "embedding": encode(rows.item(i))} for i in range(len(rows))]
    return list_response(EMBEDDINGS, served, data, created=created)


async def create_embeddings(request: web.Request, req: EmbeddingRequest) -> web.Response:
    info = request.app[ROUTER].lookup(req.model).info
    if req.late_chunking or req.chunk_boundaries is not None or req.chunk_size is not None:
        return await _late_chunked(request, req, info)
    if not outputs.plain(req.embedding_types) or req.return_tokens:
        body = await outputs.respond(
            request,
            info,
            to_request(req, embed_task(info), info),
            req.embedding_types or ["dense"],
            encoding_format=req.encoding_format,
            embed_dtype=req.embed_dtype,
            endianness=req.endianness,
            return_tokens=req.return_tokens,
        )
        record_answer(request, body["id"])
        return outputs.json_response(body)
    served = await serve(request, to_request(req, embed_task(info), info))
    created, rows = int(time.time()), served.result.outputs
    record_answer(request, response_id(EMBEDDINGS, served), rows)
    return encoded_response(
        EMBEDDINGS,
        served,
        encoding_format=req.encoding_format,
        embed_dtype=req.embed_dtype,
        endianness=req.endianness,
        created=created,
        to_json=to_response,
    )


async def _late_chunked(request: web.Request, req: EmbeddingRequest, info: ModelInfo) -> web.Response:
    if not req.late_chunking:
        raise InvalidRequest("chunk_boundaries and chunk_size need late_chunking: true", param="late_chunking")
    if req.encoding_format not in outputs.JSON_FORMATS or not outputs.plain(req.embedding_types):
        raise InvalidRequest(
            "late chunking answers dense vectors as JSON (encoding_format float or base64)", param="late_chunking"
        )
    if req.dimensions is not None:
        raise InvalidRequest("dimensions does not apply to late chunking", param="dimensions")
    if req.input_type is not None or req.prompt_name is not None:  # a prefix would move every boundary
        raise InvalidRequest("input_type and prompt_name do not combine with late chunking", param="input_type")
    served = await serve(
        request, late.late_request(to_request(req, "embed", info), req.chunk_boundaries, req.chunk_size)
    )
    body = late.to_response(
        served, encoding_format=req.encoding_format, embed_dtype=req.embed_dtype, endianness=req.endianness
    )
    record_answer(request, body["id"])
    return outputs.json_response(body)


ROUTES = (
    Route(
        "POST",
        "/v1/embeddings",
        create_embeddings,
        EmbeddingRequest,
        EmbeddingResponse,
        tasks=("embed", "token_embed"),
        summary="OpenAI embeddings (vLLM's superset)",
    ),
)
