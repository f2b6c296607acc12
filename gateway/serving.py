"""The one serving path every dialect calls: resolve the pool, apply server policy, check, submit.

A dialect validates its body, turns it into a dialect-free ``ServeRequest``
(model, inputs, pooling params with the task) and gets back the served model
and the ``PoolingResult``; it adds only its conversions. Here, once per
request and for every dialect alike:

1. the router resolves ``(model, task)`` to a pool (404 / vLLM's task error);
2. server policy fills what the request left open: ``--auto-truncate`` turns
   "no truncation" into -1; the call's deadline is now plus the request's
   ``X-Request-Timeout`` header (seconds), else plus ``--request-timeout``. At
   the deadline the client gets 504 ``deadline_exceeded`` (the pool stops
   waiting and the worker drops the call's work that has not run);
3. limits the gateway can check from the pool's ``ModelInfo`` alone run before
   anything crosses the transport: ``dimensions``, ``truncate_prompt_tokens``,
   input types and token ids (``shared.limits``, the same functions a worker
   runs at its own boundary);
4. the pools run the call (with its priority, deadline and the request's trace
   context) through their one submit: pick → admission (the input cap, caps,
   queued tokens: ``gateway.pools.admission``) → send → retry → accounting;
   the request's telemetry record gets the model, task, backend, token count
   and the worker's queue and inference times.

Ops that are not pooling calls (``/tokenize``, ``/detokenize``) take the same
road: ``lookup`` the model, then ``run`` a ``Job`` with the request's deadline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from poolgate.gateway.http.state import CONFIG, RECORD, REQUEST_ID, ROUTER, TENANT
from poolgate.gateway.pools.job import Job
from poolgate.gateway.pools.member import estimate_tokens
from poolgate.gateway.pools.model_pools import ModelPools
from poolgate.shared.config import GatewayConfig
from poolgate.shared.errors import InvalidRequest
from poolgate.shared.limits import check_inputs, check_params
from poolgate.shared.params import PoolingParams
from poolgate.shared.wire import Input, ModelInfo, PoolingCall, PoolingResult

TIMEOUT_HEADER = "X-Request-Timeout"  # seconds the client will wait (the call's deadline)


@dataclass(frozen=True)
class ServeRequest:
    """What a dialect asks for, in no dialect's terms; ``model`` None = the default model; ``priority``
    as vLLM's (lower runs earlier), None = the caller's tenant's default (else 0)."""

    model: str | None
    inputs: list[Input]
    params: PoolingParams
    priority: int | None = None


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


def deadline(config: GatewayConfig, now: float, timeout: str | None = None) -> float | None:
    """The call's deadline: ``now`` plus the request's ``X-Request-Timeout`` seconds when it sent one,
    else the server's ``--request-timeout`` (None: no deadline); a timeout that is not a positive
    number is a 400."""
    if timeout is None:
        return None if config.request_timeout_s is None else now + config.request_timeout_s
    try:
        seconds = float(timeout)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise InvalidRequest(
            f"{TIMEOUT_HEADER} must be a positive number of seconds, got {timeout[:40]!r}.", param=TIMEOUT_HEADER
        )
    return now + seconds


def priority(request: web.Request, asked: int | None) -> int:
    """The request's own priority, else its tenant's default, else 0."""
    if asked is not None:
        return asked
    tenant = request.get(TENANT)
    return tenant.tenant.priority if tenant is not None else 0


def request_deadline(request: web.Request) -> float | None:
    return deadline(request.app[CONFIG], time.time(), request.headers.get(TIMEOUT_HEADER))


async def serve(request: web.Request, req: ServeRequest) -> Served:
    """Run ``req`` for the HTTP ``request`` through the one path above."""
    config, record = request.app[CONFIG], request.get(RECORD)
    if record is not None:
        record.task = req.params.task  # known even if the model is not
    pool = request.app[ROUTER].resolve(req.model, req.params.task)
    if record is not None:
        record.model, record.backend = pool.name, pool.info.backend
    params = with_policy(config, req.params)
    check_params(pool.info, params)
    check_inputs(pool.info, req.inputs)
    request_id = request[REQUEST_ID]
    call = PoolingCall(
        request_id=request_id,
        model=pool.name,
        inputs=req.inputs,
        params=params,
        deadline=request_deadline(request),
        priority=priority(request, req.priority),
        trace_context=record.trace_context if record is not None else {},
    )
    tenant, pooled = request.get(TENANT), 0
    reserved = tenant.reserve(estimate_tokens(req.inputs)) if tenant is not None else 0
    try:
        result = await pool.submit(call)
        pooled = result.total_tokens
    finally:
        if tenant is not None:
            tenant.charge(pooled, reserved)
    if record is not None:
        record.prompt_tokens = result.total_tokens
        record.tokenize_s = result.timings.get("tokenize_s")
        record.queue_s = result.timings.get("queue_s")
        record.inference_s = result.timings.get("inference_s")
    return Served(request_id, pool.info, result)


def lookup(request: web.Request, model: str | None) -> ModelPools:
    """The pools of ``model`` (None = the default), whatever its tasks; recorded on the request."""
    pools = request.app[ROUTER].lookup(model)
    if (record := request.get(RECORD)) is not None:
        record.model = pools.name
    return pools


async def run(request: web.Request, pools: ModelPools, make: Callable[[str, float | None], Job]) -> Any:
    """The answer to the job ``make(request_id, deadline)`` builds, through the pools' one submit."""
    job = make(request[REQUEST_ID], request_deadline(request))
    return await pools.run(job)
