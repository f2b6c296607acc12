"""vLLM's raw pooling route: ``POST /pooling`` and its pure conversions.

The body is vLLM's ``PoolingRequest``: ``input`` (or chat-style
``messages``), ``model``, ``task`` (None = the model's active task: the
first of ``ModelInfo.tasks``), ``use_activation``, ``truncate_prompt_tokens``,
the encoding fields of ``/v1/embeddings`` (``encoding_format`` float | base64
| bytes | bytes_only, ``embed_dtype``, ``endianness``) and ``dimensions``,
which vLLM refuses here. Each item's ``data`` is the task's raw output: embed
``[dim]``, classify ``[labels]``, token_embed ``[T][dim]``, token_classify
``[T][labels]``; base64 and bytes are that array's raw ``embed_dtype`` codes,
row-major.

Unlike vLLM 0.33, any task the model serves is answered, not only its active
one (vLLM answers the others with 400 "Try switching the model's pooling_task
via --pooler-config.task x."): a poolgate worker serves all its tasks, mixed
in one batch, so there is nothing to switch. A task the model does not serve,
``plugin`` included, is vLLM's 400 "Unsupported task: 'x' Supported tasks: (…)"
before any plugin check. ``pool_factor`` (poolgate's, for
``token_embed``) pools each input's token vectors into about ``1/pool_factor``
as many (PyLate's hierarchical pooling, ``shared.domain.token_pooling``): fewer vectors
to index per document, at a cost in MaxSim agreement. ``input_type`` (poolgate's, as
on ``/v1/embeddings``) prefixes the model's prompt of that type, and for a model with
input roles (PyLate ColBERT) says whether the inputs are queries or documents
(``dialects.roles``; required there).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Annotated

import numpy as np
from aiohttp import web
from pydantic import BaseModel, Field

from poolgate.gateway.dialects.chat import EncodedBody
from poolgate.gateway.dialects.encoding import json_encoder
from poolgate.gateway.dialects.envelope import Usage, encoded_response, list_response, response_id
from poolgate.gateway.dialects.io_processor import NO_PLUGIN
from poolgate.gateway.dialects.prompts import prompted
from poolgate.gateway.dialects.roles import query_inputs, role_prompt
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.http.state import CONFIG, ROUTER
from poolgate.gateway.serving import Served, ServeRequest, record_answer, serve
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.limits import unsupported_task
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.tasks import PoolingTask
from poolgate.shared.domain.token_pooling import pool_tokens
from poolgate.shared.wire.messages import ModelInfo
from poolgate.shared.wire.rows import Rows

# The tasks whose output /pooling returns as it is; the others need a vLLM IO-processor plugin.
RAW_TASKS = ("embed", "classify", "token_embed", "token_classify")
EMBEDDING_TASKS = ("embed", "token_embed")  # whose last axis is gen_ai.embeddings.dimension.count
PLUGIN_BODY = 'task \'plugin\': send the plugin\'s request as "data", without "input"'


class PoolingRequest(EncodedBody):
    """The body of ``POST /pooling``; unknown fields are allowed and ignored."""

    task: PoolingTask | None = None
    input_type: str | None = None  # poolgate: a prompt, and a role model's query / document (dialects.roles)
    pool_factor: Annotated[int, Field(ge=1)] | None = (
        None  # poolgate: token_embed rows pooled (shared.domain.token_pooling)
    )


class PoolingData(BaseModel):
    index: int
    object: str = "pooling"
    data: list[float] | list[list[float]] | str


class PoolingResponse(BaseModel):
    """vLLM's PoolingResponse for float and base64 (documents the route)."""

    id: str
    object: str = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: Usage


def pooling_task(info: ModelInfo, requested: str | None, plugin: str | None = None) -> PoolingTask:
    """The task to run: the requested one if the model serves it, else its active task (vLLM's 400s).

    A worker lists its tasks active first (the pooler config's task, else vLLM's order). As in vLLM, a task
    the model does not serve is "Unsupported task" before any plugin check, ``plugin`` (the configured
    ``--io-processor-plugin``, None = none) included."""
    task = requested or (info.tasks[0] if info.tasks else None)
    if task not in info.tasks:
        raise InvalidRequest(unsupported_task(info, task), param="task")  # vLLM: a ValueError, so 400
    if task == "plugin":  # vLLM's plugin task: a "data" body for the plugin (gateway.dialects.io_processor)
        raise InvalidRequest(NO_PLUGIN if plugin is None else PLUGIN_BODY, param="task")
    if task not in RAW_TASKS:
        raise InvalidRequest(
            f"Task {task!r} is only available through an IO processor plugin, which poolgate does not load.",
            param="task",
        )
    return task


def to_request(req: PoolingRequest, info: ModelInfo, plugin: str | None = None) -> ServeRequest:
    """The dialect-free request for ``req`` to the model described by ``info`` (``plugin``: the configured
    IO-processor plugin, for ``pooling_task``)."""
    if req.dimensions is not None:
        raise InvalidRequest("dimensions is currently not supported", param="dimensions")
    inputs, special = req.call_inputs(info)
    if req.input_type is not None:
        inputs = prompted(inputs, role_prompt(info, req.input_type, None))
    params = PoolingParams(
        task=pooling_task(info, req.task, plugin),
        use_activation=req.use_activation,
        add_special_tokens=special,
        query_inputs=query_inputs(info, req.input_type, len(inputs)),
        **req.truncation(),
    )
    return ServeRequest(model=req.model, inputs=inputs, params=params, priority=req.priority)


def pooled(served: Served, pool_factor: int) -> Served:
    """``served`` with each input's token vectors pooled by ``pool_factor`` (``shared.domain.token_pooling``)."""
    rows = served.result.outputs
    items = [pool_tokens(rows.item(i), pool_factor) for i in range(len(rows))]
    offsets = np.cumsum([0, *(len(x) for x in items)], dtype=np.int64)
    return replace(served, result=replace(served.result, outputs=Rows(np.concatenate(items), offsets)))


def to_response(
    served: Served,
    *,
    encoding_format: str = "float",
    embed_dtype: str = "float32",
    endianness: str = "native",
    created: int,
) -> dict:
    """vLLM's PoolingResponse; each input's array (one row, or its block of token rows) is one item."""
    encode, rows = json_encoder(encoding_format, embed_dtype, endianness), served.result.outputs
    data = [{"index": i, "object": "pooling", "data": encode(rows.item(i))} for i in range(len(rows))]
    return list_response("pooling", served, data, created=created)


async def create_pooling(request: web.Request, req: PoolingRequest) -> web.Response:
    info = request.app[ROUTER].lookup(req.model).info
    call = to_request(req, info, request.app[CONFIG].io_processor_plugin)
    if req.pool_factor is not None and call.params.task != "token_embed":
        raise InvalidRequest(
            f"pool_factor pools token_embed vectors; the task is {call.params.task!r}", param="pool_factor"
        )
    served = await serve(request, call)
    if req.pool_factor is not None:
        served = pooled(served, req.pool_factor)
    created = int(time.time())
    record_answer(
        request, response_id("pooling", served), served.result.outputs if call.params.task in EMBEDDING_TASKS else None
    )
    return encoded_response(
        "pooling",
        served,
        encoding_format=req.encoding_format,
        embed_dtype=req.embed_dtype,
        endianness=req.endianness,
        created=created,
        to_json=to_response,
    )


ROUTES = (
    Route("POST", "/pooling", create_pooling, PoolingRequest, PoolingResponse, summary="vLLM raw pooling output"),
)
