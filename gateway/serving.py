"""The one serving path every dialect calls: resolve once, tokenize, count, admit, submit, finish.

A dialect validates its body, turns it into a dialect-free ``ServeRequest``
(model, inputs, pooling params with the task) and gets back the served model
and the ``PoolingResult``; it adds only its conversions. Here, once per
request and for every dialect alike, into one ``Resolved`` the rest of the way
reads:

1. the router resolves ``(model, task)`` to the model's pools (404 / vLLM's
   task error);
2. server policy fills what the request left open: ``--auto-truncate`` turns
   "no truncation" into -1; the call's deadline is now plus the request's
   ``X-Request-Timeout`` header (seconds), else plus ``--request-timeout``. At
   the deadline the client gets 504 ``deadline_exceeded`` (the pool stops
   waiting and the worker drops the call's work that has not run). The call's
   lane is the request's ``X-Poolgate-Lane`` header: ``live`` (the default) or
   ``bulk`` (a batch job's lines: admitted, queued and batched below every
   live call, ``shared.domain.lanes``); any other value is a 400. Any client
   may send ``bulk``: it only lowers its own requests, so it needs no
   permission (a tenant's quotas count bulk requests as any other);
3. the request's own size limits (inputs per request, characters per input,
   images and audio clips per request) are checked before any tokenizing, and
   its ``http(s)`` image and audio URLs are fetched (``gateway.media_fetch``:
   only from ``--allowed-media-domains``, with its address, size, time and
   redirect rules); the record gets the input's modalities and media count;
4. the model's ``Front`` (``shared.inputs.front``) checks the call against the
   model (task, params, inputs: ``shared.domain.limits``), shapes and tokenizes its
   inputs with the model's own tokenizer in the gateway's tokenizer pool
   (``gateway.tokenizing``, off the event loop) and counts them; from here on
   every count is exact: ``--max-tokens-per-request``, the tenant's token quota
   (``take_tokens``), the pools' admission and the workers' deadline drop;
5. the pools run the tokenized call (a paced request, ``http.state.PACED``: a
   gRPC stream's batch, waits out an admission refusal instead of a 429,
   asking again every ``PACE_S`` without tokenizing again) (with its priority, lane, deadline and the
   request's trace context) through their one submit: pick → admission →
   send → retry → accounting; the ``Front`` finishes the answer (sparse rows,
   late chunks, windows) and the request's telemetry record gets the model,
   task, backend, token count and the tokenize, queue and inference times.

The record's other fields are written here too, and nowhere else: what the
request asked (``record_asked``: the route's operation before the model is
known, the encoding formats of its body) and what the dialect answered
(``record_answer``: the body's id and its vectors' dimension); ``resolve``
records the lane. No dialect touches a ``RequestRecord``.

The request is a ``Scope``: what this path reads of an aiohttp ``web.Request``
(its app, headers and per-request state). The gRPC server (``gateway.grpc``)
passes a scope of its own per call, so a gRPC call runs this same path.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass, replace

from aiohttp import web

from poolgate.gateway.http.state import CONFIG, PACED, RECORD, REQUEST_ID, ROUTER, TENANT
from poolgate.gateway.media_fetch import fetch_media
from poolgate.gateway.pools.model_pools import ModelPools
from poolgate.gateway.scope import CallScope
from poolgate.gateway.tokenizing import run_tokenizer
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import InvalidRequest, Overloaded
from poolgate.shared.domain.lanes import LANES, LIVE, Lane, lane_of
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs.front import Prepared
from poolgate.shared.wire.media import MEDIA_KINDS, MediaInput
from poolgate.shared.wire.messages import ChatInput, Input, ModelInfo, PoolingCall, PoolingResult
from poolgate.shared.wire.rows import Rows

PACE_S = 0.02  # how often a paced request asks the pools' admission again
TIMEOUT_HEADER = "X-Request-Timeout"  # seconds the client will wait (the call's deadline)
PRIORITY_HEADER = "X-Poolgate-Priority"  # a request's priority where its body has no field for it (vLLM's meaning)
LANE_HEADER = "X-Poolgate-Lane"  # live (the default) or bulk: below every live call (shared.domain.lanes)


# One request as this path reads it (module doc): an aiohttp request, or a gRPC call's scope (its app, its
# metadata as headers, its per-request state).
Scope = web.Request | CallScope


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


def with_lora(params: PoolingParams, lora: str | None) -> PoolingParams:
    """``params`` (and each further output's) run with the LoRA adapter the request's ``model`` named."""
    if lora is None:
        return params
    return replace(params, lora=lora, outputs=tuple(replace(o, lora=lora) for o in params.outputs))


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


def lane(value: str | None) -> Lane:
    """The call's lane from the request's ``X-Poolgate-Lane`` header (None: live; case and spaces
    aside); any other value is a 400 naming the header."""
    if value is None:
        return LIVE
    try:
        return lane_of(value.strip().lower())
    except ValueError:
        raise InvalidRequest(
            f"{LANE_HEADER} must be one of {', '.join(LANES)}, got {value[:40]!r}.", param=LANE_HEADER
        ) from None


def priority(request: Scope, asked: int | None) -> int:
    """The request's own priority (its body's, else its ``X-Poolgate-Priority`` header: for the dialects whose
    bodies have no such field, TEI's and gRPC's), else its tenant's default, else 0."""
    if asked is not None:
        return asked
    if (sent := request.headers.get(PRIORITY_HEADER)) is not None:
        try:
            return int(sent)
        except ValueError:
            raise InvalidRequest(
                f"{PRIORITY_HEADER} must be an integer (lower runs earlier), got {sent[:40]!r}.", param=PRIORITY_HEADER
            ) from None
    tenant = request.get(TENANT)
    return tenant.tenant.priority if tenant is not None else 0


def request_deadline(request: Scope) -> float | None:
    return deadline(request.app[CONFIG], time.time(), request.headers.get(TIMEOUT_HEADER))


def request_lane(request: Scope) -> Lane:
    return lane(request.headers.get(LANE_HEADER))


@dataclass(frozen=True, eq=False)
class Resolved:
    """One request resolved once (module doc): its model's pools and its call, tokenized and counted."""

    request_id: str
    pools: ModelPools
    prepared: Prepared
    tokenize_ns: tuple[int, int]  # wall clock around its wait for and run in the tokenizer pool

    @property
    def tokens(self) -> int:
        return self.prepared.total_tokens


async def serve(request: Scope, req: ServeRequest) -> Served:
    """Run ``req`` for the HTTP ``request`` through the one path above."""
    resolved = await resolve(request, req)
    tenant = request.get(TENANT)
    while True:
        if tenant is not None:
            tenant.take_tokens(resolved.tokens)
        try:
            answer = await resolved.pools.submit(resolved.prepared.call)
            break
        except Overloaded:  # refused before it ran: the tenant keeps its tokens
            if tenant is not None:
                tenant.give_back(resolved.tokens)
            if not request.get(PACED):
                raise
        await asyncio.sleep(PACE_S)  # a paced request (``http.state.PACED``) asks again, tokenized once
    result = resolved.pools.front.finish(resolved.prepared, answer)
    if (record := request.get(RECORD)) is not None:
        record.prompt_tokens = result.total_tokens
        record.tokenize_s, record.tokenize_ns = result.timings.get("tokenize_s"), resolved.tokenize_ns
        record.queue_s = result.timings.get("queue_s")
        record.inference_s = result.timings.get("inference_s")
    info, lora = resolved.pools.info, resolved.prepared.params.lora
    # a LoRA adapter's call answers with the adapter's name as its model, as vLLM does
    return Served(resolved.request_id, info if lora is None else replace(info, served_model_name=lora), result)


async def resolve(request: Scope, req: ServeRequest) -> Resolved:
    """Steps 1 to 4 of the module doc: the request's pools, its call checked, tokenized and counted."""
    record = request.get(RECORD)
    call_lane = request_lane(request)
    if record is not None:
        record.task = req.params.task  # known even if the model is not
        record.lane = call_lane
    pools = request.app[ROUTER].resolve(req.model, req.params.task)
    if record is not None:
        record.model, record.backend = pools.name, pools.info.backend
    lengths = [chars(x) for x in req.inputs]  # once: the per-input cap here, x-compute-characters (http.timings)
    pools.check(len(req.inputs), max(lengths, default=0))
    if record is not None:
        record.characters = sum(lengths)
    call = PoolingCall(
        request_id=request[REQUEST_ID],
        model=pools.name,
        inputs=req.inputs,
        params=with_lora(with_policy(request.app[CONFIG], req.params), request.app[ROUTER].lora_of(req.model)),
        deadline=request_deadline(request),
        priority=priority(request, req.priority),
        trace_context=record.trace_context if record is not None else {},
        lane=call_lane,
    )
    if record is not None:
        record.modalities, record.media = modalities(req.inputs)
    call = await fetch_media(call, pools.front.stage.limits)  # its images' count checked, their URLs fetched
    started = time.time_ns()
    prepared = await run_tokenizer(request.app, pools.front.prepare, call)
    return Resolved(call.request_id, pools, prepared, (started, time.time_ns()))


def chars(x: Input) -> int:
    """The characters of one input (the per-input cap, checked before tokenizing): a text's, every text
    field of an object input, a chat's contents; 0 for token ids."""
    if isinstance(x, str):
        return len(x)
    if isinstance(x, list):
        return 0
    if isinstance(x, ChatInput):
        return sum(len(str(m.get("content") or "")) for m in x.messages)
    if isinstance(x, MediaInput):
        return sum(len(p) for p in x.parts if isinstance(p, str))
    values = (getattr(x, f.name) for f in fields(x)) if is_dataclass(x) else ()
    return sum(len(v) for v in values if isinstance(v, str))


def modalities(inputs: Sequence[Input]) -> tuple[tuple[str, ...], dict[str, int]]:
    """What the inputs hold (``text``, ``image``, ``audio``, in that order; a token-id list counts as text)
    and how many images and audio clips."""
    kinds: set[str] = set()
    media = dict.fromkeys(MEDIA_KINDS, 0)
    for x in inputs:
        if isinstance(x, MediaInput):
            kinds |= x.kinds
            for ref in x.media:
                media[ref.kind] += 1
        else:
            kinds.add("text")
    return tuple(k for k in ("text", *MEDIA_KINDS) if k in kinds), {k: n for k, n in media.items() if n}


def lookup(request: Scope, model: str | None) -> ModelPools:
    """The pools of ``model`` (None = the default), whatever its tasks; recorded on the request. A tokenizer
    route (answered in the gateway, at once) checks the request's timeout and lane headers as every route does."""
    request_deadline(request)  # 400 for a timeout that is not a positive number of seconds
    request_lane(request)  # 400 for a lane that is not live or bulk
    pools = request.app[ROUTER].lookup(model)
    if (record := request.get(RECORD)) is not None:
        record.model = pools.name
    return pools


def record_asked(request: Scope, *, task: str | None = None, formats: Sequence[str] = ()) -> None:
    """What the request asked, on its telemetry record before anything can fail: its route's operation
    (``task``; ``resolve`` refines it) and the encoding formats its body asks for (each left as it is
    when not given)."""
    if (record := request.get(RECORD)) is None:
        return
    if task is not None:
        record.task = task
    if formats:
        record.encoding_formats = tuple(formats)


def record_answer(request: Scope, response_id: str, vectors: Rows | None = None) -> None:
    """What the dialect answered, on the request's telemetry record: the response body's id and, when it
    answered embedding ``vectors``, their dimension (the last axis of the first input's array)."""
    if (record := request.get(RECORD)) is None:
        return
    record.response_id = response_id
    if vectors is not None and len(vectors):
        record.dimension_count = int(vectors.item(0).shape[-1])
