"""The one serving path every dialect calls: resolve the pool, apply server policy, check, submit.

A dialect validates its body, turns it into a dialect-free ``ServeRequest``
(model, inputs, pooling params with the task) and gets back the served model
and the ``PoolingResult``; it adds only its conversions. Here, once per
request and for every dialect alike:

1. the router resolves ``(model, task)`` to a pool (404 / vLLM's task error);
2. server policy fills what the request left open: ``--auto-truncate`` turns
   "no truncation" into -1, ``--request-timeout`` becomes the call's deadline;
3. limits the gateway can check from the pool's ``ModelInfo`` alone run before
   anything crosses the transport: the input count cap, ``dimensions``,
   ``truncate_prompt_tokens``, input types and token ids (``shared.limits``,
   the same functions a worker runs at its own boundary);
4. the pool submits the call to its least-loaded worker, with the request's
   trace context; the request's telemetry record gets the model, task,
   backend, token count and the worker's queue and inference times.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from aiohttp import web

from poolgate.gateway.http.state import CONFIG, RECORD, REQUEST_ID, ROUTER
from poolgate.shared.config import GatewayConfig
from poolgate.shared.errors import InvalidRequest
from poolgate.shared.limits import check_inputs, check_params
from poolgate.shared.params import PoolingParams
from poolgate.shared.wire import Input, ModelInfo, PoolingCall, PoolingResult


@dataclass(frozen=True)
class ServeRequest:
    """What a dialect asks for, in no dialect's terms; ``model`` None = the default model."""

    model: str | None
    inputs: list[Input]
    params: PoolingParams


@dataclass(frozen=True)
class Served:
    """The answer a dialect turns into its response body."""

    request_id: str
    info: ModelInfo  # of the model that served it (its served name, dims, ...)
    result: PoolingResult


def with_policy(config: GatewayConfig, params: PoolingParams) -> PoolingParams:
    """The server's defaults for what the request left open."""
    if params.truncate_prompt_tokens is None and config.auto_truncate:
        return replace(params, truncate_prompt_tokens=-1)
    return params


def check_input_count(config: GatewayConfig, inputs: list[Input]) -> None:
    if len(inputs) > config.max_inputs_per_request:
        raise InvalidRequest(f"Too many inputs: {len(inputs)} in one request; "
                             f"the limit is {config.max_inputs_per_request}.", param="input")


def deadline(config: GatewayConfig, now: float) -> float | None:
    return None if config.request_timeout_s is None else now + config.request_timeout_s


async def serve(request: web.Request, req: ServeRequest) -> Served:
    """Run ``req`` for the HTTP ``request`` through the one path above."""
    config, record = request.app[CONFIG], request.get(RECORD)
    if record is not None:
        record.task = req.params.task  # known even if the model is not
    pool = request.app[ROUTER].resolve(req.model, req.params.task)
    if record is not None:
        record.model, record.backend = pool.name, pool.info.backend
    params = with_policy(config, req.params)
    check_input_count(config, req.inputs)
    check_params(pool.info, params)
    check_inputs(pool.info, req.inputs)
    request_id = request[REQUEST_ID]
    call = PoolingCall(request_id=request_id, model=pool.name, inputs=req.inputs, params=params,
                       deadline=deadline(config, time.time()),
                       trace_context=record.trace_context if record is not None else {})
    result = await pool.submit(call)
    if record is not None:
        record.prompt_tokens = result.total_tokens
        record.tokenize_s = result.timings.get("tokenize_s")
        record.queue_s = result.timings.get("queue_s")
        record.inference_s = result.timings.get("inference_s")
    return Served(request_id, pool.info, result)
