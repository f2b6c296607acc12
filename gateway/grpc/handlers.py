"""grpcio handlers around poolgate's methods: unary calls, bounded streams, malformed messages.

``unary(app, method, fn)``: one call is one serving-path request (one record,
one tenant admission); the answer's trailing metadata carry its id and TEI's
timing headers.

``streaming(app, method, key, run, ...)``: a bidirectional stream. Each message
is one input; a reader takes messages off the stream only while fewer than
``--grpc-stream-inflight`` of its inputs are unanswered, so a client that
sends forever is held back by HTTP/2 flow control instead of filling the
queue. Messages that arrived together with the same options (``key``) go to
the serving path as one batch (at most ``--max-inputs-per-request``); with
``STREAM_BATCHES`` of a stream's batches running, the next gathers what
arrives meanwhile, so a stream of 10,000 texts is tokenized and queued in
batches as big as the client keeps up with, not one by one;
answers come back in the order the messages came. A batch admission refuses
(what a unary call gets ``RESOURCE_EXHAUSTED`` for) waits in the serving path
until admission takes it (``http.state.PACED``: asked again every 20 ms,
tokenized once); one its tenant's quota refuses waits the quota's
``Retry-After`` and goes again; the stream is unread meanwhile: a stream is
paced by the server, not ended, for being fast. Any other failure ends the
stream with its status (answers before it were sent). A client that goes away
or a deadline that passes cancels the call: the stream's batches still queued
or running are cancelled with it (the pools drop their work in the workers).

A message that does not parse fails the call with ``INVALID_ARGUMENT`` (grpcio
would answer ``INTERNAL``): the deserializers return ``Malformed``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from aiohttp import web
from google.protobuf.message import DecodeError

from poolgate.gateway.grpc.call import GrpcCall
from poolgate.gateway.http.state import PACED
from poolgate.gateway.scope import CallScope
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import ClientClosedRequest, InternalError, InvalidRequest, Overloaded, PoolgateError

M = TypeVar("M")
R = TypeVar("R")
END = object()  # the stream's end, in the reader's queue and the answers' queue
# batches of one stream running at once: the messages that arrive meanwhile gather into the next batch, so a fast
# stream goes in batches as big as it sends (up to --max-inputs-per-request) and a trickle still goes at once
STREAM_BATCHES = 2
RETRY_MIN_S, RETRY_MAX_S = 0.05, 1.0  # a stream's batch refused by its tenant's quota waits this long


@dataclass(frozen=True)
class Malformed:
    """A message that did not parse, and why."""

    error: str


def parser(cls: Any) -> Callable[[bytes], Any]:
    """``cls.FromString`` that returns ``Malformed`` instead of raising."""

    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except (DecodeError, RuntimeError, ValueError) as exc:  # upb raises DecodeError; be generous
            return Malformed(str(exc) or type(exc).__name__)

    return parse


def well_formed(message: Any, kind: str) -> Any:
    if isinstance(message, Malformed):
        raise InvalidRequest(f"The {kind} message does not parse: {message.error}")
    return message


Unary = Callable[[CallScope, Any], Awaitable[Any]]


def unary(
    app: web.Application, method: str, kind: str, fn: Unary, *, public: bool = False, recorded: bool = True
) -> Callable[..., Awaitable[Any]]:
    """The grpcio handler of a unary method (module doc); ``kind``: the request message's name. ``public``: no
    API key needed, ``recorded``: counted and traced (health and metadata methods are neither, as HTTP's ops
    routes)."""

    async def handle(message: Any, context: grpc.aio.ServicerContext) -> Any:
        call = GrpcCall(app, context, method)
        scope = call.scope()
        if recorded:
            call.record(scope)
        try:
            if not public:
                call.enter(scope)
            try:
                answer = await fn(scope, well_formed(message, kind))
            finally:
                call.leave()
        except BaseException as exc:
            await call.fail(scope, exc)
        call.served_metadata(scope)
        call.end(scope)
        return answer

    return handle


def collecting(
    app: web.Application, method: str, kind: str, fn: Callable[[CallScope, list[Any]], Awaitable[Any]], most: int
) -> Callable[..., Awaitable[Any]]:
    """The grpcio handler of a stream-to-one method: every message of the stream (at most ``most``: one more
    fails the call with INVALID_ARGUMENT before the rest is read), then ``fn(scope, messages)`` answers once."""

    async def read_all(scope: CallScope, requests: AsyncIterator[Any]) -> Any:
        messages: list[Any] = []
        async for message in requests:
            if len(messages) == most:
                raise InvalidRequest(f"A {method} stream may carry at most {most} messages.")
            messages.append(well_formed(message, kind))
        return await fn(scope, messages)

    async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await unary(app, method, kind, lambda scope, _: read_all(scope, requests))(None, context)

    return handle


Batch = Callable[[CallScope, list[Any]], Awaitable[list[Any]]]


def streaming(
    app: web.Application, method: str, kind: str, key: Callable[[Any], Hashable], run: Batch, config: GatewayConfig
) -> Callable[..., AsyncIterator[Any]]:
    """The grpcio handler of a stream-to-stream method (module doc): ``run(scope, messages)`` answers a batch
    of messages sharing ``key``, one answer per message in order."""
    cap = config.grpc.stream_inflight if config.grpc is not None else 256
    most = config.max_inputs_per_request

    async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        call = GrpcCall(app, context, method)
        first = call.scope()
        try:
            call.enter(first)  # (recorded only when refused: the stream's batches are its recorded requests)
        except BaseException as exc:
            call.record(first)
            await call.fail(first, exc)
        try:
            async for answer in _answers(call, requests, kind, key, run, cap, most):
                yield answer
        finally:
            call.leave()

    return handle


async def _answers(
    call: GrpcCall,
    requests: AsyncIterator[Any],
    kind: str,
    key: Callable[[Any], Hashable],
    run: Batch,
    cap: int,
    most: int,
) -> AsyncIterator[Any]:
    slots = asyncio.Semaphore(cap)
    running = asyncio.Semaphore(STREAM_BATCHES)
    arrived: asyncio.Queue[Any] = asyncio.Queue()
    batches: asyncio.Queue[Any] = asyncio.Queue()
    tasks: list[asyncio.Task] = []

    async def read() -> None:
        try:
            async for message in requests:
                await slots.acquire()
                arrived.put_nowait(message)
        except Exception as exc:  # the stream broke (the client reset it): end with what failed
            arrived.put_nowait(exc)
        arrived.put_nowait(END)

    async def batched(group: list[Any]) -> list[Any]:
        while True:
            scope = call.scope()
            scope[PACED] = True  # admission's refusals are waited out in the serving path, tokenized once
            call.record(scope)
            try:
                answers = await run(scope, group)
            except Overloaded as err:  # its tenant's quota (admission's wait is the serving path's): wait, again
                call.end(scope, err)
                await asyncio.sleep(min(max(err.retry_after_s or RETRY_MIN_S, RETRY_MIN_S), RETRY_MAX_S))
                continue
            except asyncio.CancelledError:
                call.end(scope, ClientClosedRequest("client cancelled the call"), grpc.StatusCode.CANCELLED)
                raise
            except BaseException as exc:
                call.end(scope, exc if isinstance(exc, PoolgateError) else InternalError("Internal server error."))
                raise
            call.end(scope)
            return answers

    async def group() -> None:
        held: Any = None
        while True:
            message = held if held is not None else await arrived.get()
            held = None
            if message is END or isinstance(message, BaseException):
                batches.put_nowait(message)
                return
            if isinstance(message, Malformed):
                batches.put_nowait(InvalidRequest(f"The {kind} message does not parse: {message.error}"))
                return
            await running.acquire()  # at most STREAM_BATCHES of this stream's batches at once: the rest gather
            messages, k = [message], key(message)
            while len(messages) < most and not arrived.empty():
                nxt = arrived.get_nowait()
                if nxt is END or isinstance(nxt, BaseException | Malformed) or key(nxt) != k:
                    held = nxt
                    break
                messages.append(nxt)
            task = asyncio.create_task(batched(messages))
            task.add_done_callback(lambda _: running.release())
            tasks.append(task)
            batches.put_nowait(task)

    reader, grouper = asyncio.create_task(read()), asyncio.create_task(group())
    try:
        while True:
            item = await batches.get()
            if item is END:
                break
            if isinstance(item, BaseException):
                await call.fail(None, item)
            try:
                answers = await item
            except BaseException as exc:
                await call.fail(None, exc)
            for answer in answers:
                slots.release()
                yield answer
    finally:
        for task in (reader, grouper, *tasks):
            task.cancel()
        for task in (reader, grouper, *tasks):
            with contextlib.suppress(BaseException):
                await task
