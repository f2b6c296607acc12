"""The worker's transport server: request frames in, one task per request, response frames out.

The protocol is described in ``shared.wire.transport``. Each connection reads
frames in a loop and runs every request as its own task, so many calls are in
flight at once; responses are written whole (one ``write`` per frame), so they
never interleave. This is the one place in the worker that turns exceptions
into error frames: a ``PoolgateError`` travels as itself, anything else as an
``InternalError`` (traceback logged). A malformed frame is answered with an
error, a broken stream closes only its connection; the worker keeps serving.
A ``cancel`` frame, or the connection closing, cancels the request's task,
and the engine drops its queued sequences. While ``draining`` is set (the
worker is shutting down) new pool calls are refused with ``Unavailable``, which
the gateway retries on another worker, and ``health`` says not ready.

Who may connect (token hello, TLS, socket permissions) is ``workers.listener``'s job.
"""
from __future__ import annotations

import asyncio
import logging
import socket
from typing import Awaitable, Callable

import numpy as np

from poolgate.shared.config.frozen import TransportSecurity
from poolgate.shared.domain.errors import InternalError, InvalidRequest, PoolgateError, Unavailable
from poolgate.shared.telemetry.log_limit import LogLimiter
from poolgate.shared.wire.transport import FrameError, read_frame
from poolgate.shared.wire.token_call import TokenCall
from poolgate.shared.wire.messages import ModelInfo, decode_frame, encode_frame
from poolgate.workers.engine.engine import Engine
from poolgate.workers.listener import authenticate, error_frame, listen

log = logging.getLogger("poolgate.worker.server")
_failures = LogLimiter(log)  # per-connection and per-call failures: once per window, with a count

OpResult = tuple[dict, list[np.ndarray]]


async def serve(address: str, engine: Engine, info: ModelInfo,
                security: TransportSecurity = TransportSecurity(), *,
                draining: asyncio.Event | None = None) -> asyncio.Server:
    """Listen on ``unix:/path`` or ``tcp://host:port``; returns the started server.

    Who may connect is ``workers.listener``'s job: ValueError for TLS on a Unix
    socket, half a TLS configuration, or a TCP listener beyond loopback with no
    token (and no ``insecure_no_token``).
    """
    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if security.token is not None and not await authenticate(reader, writer, security.token):
            return
        await _Connection(engine, info, reader, writer, draining).serve()

    return await listen(address, on_connect, security)


def bound_address(server: asyncio.Server) -> str:
    """The address clients should dial (a ``tcp://...:0`` listener reports its real port)."""
    sock = server.sockets[0]
    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


async def _pool(conn: "_Connection", header: dict, arrays: list[np.ndarray]) -> OpResult:
    """A tokenized call (``shared.wire.token_call``): its header in ``call``, its blocks the frame's arrays."""
    try:
        call = TokenCall.from_wire(header["call"], arrays)
    except (KeyError, TypeError, ValueError, StopIteration) as exc:
        raise InvalidRequest(f"malformed pool call: {exc!r}") from exc
    if conn.draining.is_set():  # shutting down: the gateway retries the call on another worker
        raise Unavailable("worker is draining (shutting down)")
    result = await conn.engine.submit_tokens(call)
    header = {"prompt_tokens": result.prompt_tokens, "timings": result.timings}
    arrays = result.outputs.arrays()
    if result.more:  # a multi-output call: each further block's array count, its arrays after
        header["more"] = [{"arrays": len(more.outputs.arrays())} for more in result.more]
        arrays += [a for more in result.more for a in more.outputs.arrays()]
    return header, arrays


async def _info(conn: "_Connection", header: dict, arrays: list[np.ndarray]) -> OpResult:
    """The ``ModelInfo``; with ``tokenizer``, also the model's ``TokenizerFiles`` (``info`` and
    ``tokenizer`` in the result, the tokenizer file as the frame's one array)."""
    if not header.get("tokenizer"):
        return conn.info.to_wire(), []
    files = getattr(conn.engine.front.encoder, "files", None)
    if files is None:
        raise InvalidRequest("this worker's model has no tokenizer files to send")
    settings, data = files.to_wire()
    return {"info": conn.info.to_wire(), "tokenizer": settings}, [data]


async def _health(conn: "_Connection", header: dict, arrays: list[np.ndarray]) -> OpResult:
    draining = conn.draining.is_set()
    return {"ready": not draining, "draining": draining, **conn.engine.load()}, []


async def _hello(conn: "_Connection", header: dict, arrays: list[np.ndarray]) -> OpResult:
    """A client's token hello on a worker that requires none (``workers.listener`` checks it where one is set)."""
    return {}, []


async def _lora(conn: "_Connection", header: dict, arrays: list[np.ndarray]) -> OpResult:
    """Load (``path``: a PEFT folder, read off the loop) or unload a run-time LoRA adapter ``name``
    (``workers.models.run_loras``); the embedding cache forgets the name's outputs either way."""
    loras, name, action = conn.engine.loras, header.get("name"), header.get("action")
    if loras is None:
        raise InvalidRequest(f"model {conn.info.served_model_name!r} serves no LoRA adapters (--max-loras 0)")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("lora: a name is required")
    if action == "load":
        await asyncio.to_thread(loras.load, name, str(header.get("path") or ""))
    elif action == "unload":
        loras.unload(name)
    else:
        raise InvalidRequest(f"lora: action {action!r} is not load or unload")
    if conn.engine.cache is not None:
        conn.engine.cache.forget_lora(name)
    return {"loaded": sorted(loras.slots)}, []


OPS: dict[str, Callable[["_Connection", dict, list[np.ndarray]], Awaitable[OpResult]]] = {
    "pool": _pool,
    "info": _info,
    "health": _health,
    "hello": _hello,
    "lora": _lora,
}


class _Connection:
    """One client connection: its reader loop, its request tasks and its writer."""

    def __init__(self, engine: Engine, info: ModelInfo, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, draining: asyncio.Event | None = None):
        self.engine, self.info = engine, info
        self.draining = draining or asyncio.Event()  # set: pool calls are refused with Unavailable
        self.reader, self.writer = reader, writer
        self.tasks: dict[int, asyncio.Task] = {}
        self.drain_lock = asyncio.Lock()

    async def serve(self) -> None:
        try:
            while True:
                head, payload = await read_frame(self.reader)
                self._dispatch(head, payload)
        except asyncio.IncompleteReadError:
            pass  # the client closed the connection
        except (FrameError, OSError) as exc:
            _failures.log(logging.WARNING, ("connection", str(exc)), "closing a transport connection: %s", exc)
        except asyncio.CancelledError:
            pass  # the loop is shutting down; ending quietly spares 3.11 a spurious error log
        finally:
            for task in list(self.tasks.values()):
                task.cancel()  # nobody is left to read the answers
            self.writer.close()

    def _dispatch(self, head: bytes, payload: bytes) -> None:
        try:
            header, arrays = decode_frame(head, payload)
            if not isinstance(header, dict):
                raise ValueError("frame header is not a JSON object")
        except Exception as exc:
            _failures.log(logging.WARNING, ("frame", type(exc)), "malformed request frame: %r", exc)
            self._send(error_frame(None, InvalidRequest(f"malformed request frame: {exc}")))
            return
        rid = header.get("id")
        if not isinstance(rid, int):
            self._send(error_frame(None, InvalidRequest("request id must be an integer")))
            return
        if header.get("op") == "cancel":
            if rid in self.tasks:
                self.tasks[rid].cancel()
            return
        if rid in self.tasks:
            self._send(error_frame(rid, InvalidRequest("request id is already in flight")))
            return
        task = asyncio.create_task(self._answer(rid, header, arrays))
        self.tasks[rid] = task
        task.add_done_callback(lambda _: self.tasks.pop(rid, None))

    async def _answer(self, rid: int, header: dict, arrays: list[np.ndarray]) -> None:
        try:
            op = OPS.get(header.get("op"))
            if op is None:
                raise InvalidRequest(f"unknown op {header.get('op')!r}; expected one of {sorted(OPS)}")
            result, out = await op(self, header, arrays)
            frame = encode_frame({"id": rid, "ok": True, "result": result}, out)
        except PoolgateError as exc:
            frame = error_frame(rid, exc)
        except Exception as exc:
            _failures.log(logging.ERROR, ("op", header.get("op"), repr(exc)), "request %s (op %r) failed", rid,
                          header.get("op"), exc_info=True)
            frame = error_frame(rid, InternalError(str(exc) or type(exc).__name__))
        self._send(frame)
        async with self.drain_lock:
            try:
                await self.writer.drain()
            except OSError:
                pass  # the client is gone; the reader loop will notice

    def _send(self, frame: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(frame)
