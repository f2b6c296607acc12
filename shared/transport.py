"""The gateway's client for the gateway↔worker transport: addresses, frames, multiplexed calls.

Addresses are ``unix:/path/to.sock`` or ``tcp://host:port``. Every message is
one ``shared.wire`` frame. A request header is ``{"id", "op", "call"?}`` with
``op`` in ``pool | info | health | tokenize | detokenize | cancel``; a response header is
``{"id", "ok": true, "result"}`` (a call's outputs ride as the frame's arrays:
one ``Rows`` block, never one array per input) or
``{"id", "ok": false, "error": PoolgateError.to_wire()}``. Many requests share
one connection, matched by id; ``cancel`` (no response) tells the worker the
caller left so it drops that request's sequences. Losing the connection fails
every pending call with ``Unavailable``.

Security (``shared.transport_security``): with a token, the client's first
frame is the ``hello`` carrying it, and ``connect`` returns only once the worker
accepted it; with an ``ssl.SSLContext``, TCP connections run TLS. A worker that
refuses the client (wrong or missing token) is ``Unavailable`` with its reason.
"""
from __future__ import annotations

import asyncio
import itertools
import ssl
from dataclasses import dataclass

import numpy as np

from poolgate.shared.errors import InternalError, Unauthorized, Unavailable, from_wire
from poolgate.shared.rows import Rows
from poolgate.shared.transport_security import HELLO_ID, MAX_HELLO_BYTES
from poolgate.shared.wire import (MAX_HEADER_BYTES, PREFIX, Input, ModelInfo, PoolingCall, PoolingResult, decode_frame,
                                  encode_frame, input_to_wire)


@dataclass(frozen=True)
class Address:
    """A parsed transport address: a Unix socket path, or a TCP host and port."""

    kind: str  # "unix" | "tcp"
    path: str | None = None
    host: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.kind == "unix" else f"tcp://{self.host}:{self.port}"


def parse_address(address: str) -> Address:
    """``unix:/p.sock`` or ``tcp://host:port`` (``[v6]`` hosts allowed); ValueError otherwise."""
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ValueError(f"unix address needs a socket path: {address!r}")
        return Address("unix", path=path)
    if address.startswith("tcp://"):
        host, sep, port = address[len("tcp://"):].rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"tcp address must be tcp://host:port, got {address!r}")
        return Address("tcp", host=host, port=int(port))
    raise ValueError(f"transport address must start with unix: or tcp://, got {address!r}")


async def open_stream(address: str, tls: ssl.SSLContext | None = None, server_name: str | None = None,
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to ``address``; TCP runs TLS with ``tls`` (checked against ``server_name`` or the host)."""
    addr = parse_address(address)
    if addr.kind == "unix":
        if tls is not None:
            raise ValueError(f"TLS is for TCP workers, not {address}")
        return await asyncio.open_unix_connection(addr.path)
    if tls is None:
        return await asyncio.open_connection(addr.host, addr.port)
    return await asyncio.open_connection(addr.host, addr.port, ssl=tls, server_hostname=server_name or addr.host)


class FrameError(Exception):
    """The byte stream is not a frame (bad length prefix): the connection must close."""


async def read_frame(reader: asyncio.StreamReader, max_bytes: int | None = None) -> tuple[bytes, bytes]:
    """One frame's raw header and payload; IncompleteReadError at EOF; FrameError over the limits."""
    head_len, payload_len = PREFIX.unpack(await reader.readexactly(PREFIX.size))
    if head_len > MAX_HEADER_BYTES:
        raise FrameError(f"frame header of {head_len} bytes exceeds {MAX_HEADER_BYTES}")
    if max_bytes is not None and head_len + payload_len > max_bytes:
        raise FrameError(f"frame of {head_len + payload_len} bytes exceeds {max_bytes}")
    return await reader.readexactly(head_len), await reader.readexactly(payload_len)


@dataclass(frozen=True)
class _Dialer:
    """How one client reaches its worker: address, timeout, token and TLS (also for redials)."""

    address: str
    timeout: float
    token: str | None = None
    tls: ssl.SSLContext | None = None
    server_name: str | None = None

    async def dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.wait_for(open_stream(self.address, self.tls, self.server_name),
                                                    self.timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise Unavailable(f"cannot connect to worker at {self.address}: {exc or type(exc).__name__}") from exc
        if self.token is not None:
            try:
                await asyncio.wait_for(self._hello(reader, writer), self.timeout)
            except BaseException:
                writer.close()
                raise
        return reader, writer

    async def _hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Send the token; return once the worker accepts it, else raise ``Unavailable`` with its reason."""
        writer.write(encode_frame({"id": HELLO_ID, "op": "hello", "token": self.token}))
        try:
            await writer.drain()
            reply, _ = decode_frame(*await read_frame(reader, MAX_HELLO_BYTES))
        except (OSError, asyncio.IncompleteReadError, FrameError, ValueError) as exc:
            raise Unavailable(f"worker at {self.address} dropped the handshake: "
                              f"{exc or type(exc).__name__}") from exc
        except asyncio.TimeoutError:
            raise Unavailable(f"worker at {self.address} did not answer the handshake") from None
        if not reply.get("ok"):
            reason = (reply.get("error") or {}).get("message", "no reason given")
            raise Unavailable(f"worker at {self.address} refused the connection: {reason}")


class WorkerClient:
    """One connection to one worker, with any number of requests in flight.

    After the connection is lost, the next request dials again once, so a
    worker restarted at the same address is reached without a new client.
    """

    def __init__(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 connect_timeout: float = 10.0, dialer: _Dialer | None = None):
        self.address = address
        self.connect_timeout = connect_timeout
        self._dialer = dialer or _Dialer(address, connect_timeout)
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._drain_lock = asyncio.Lock()
        self._connect_lock = asyncio.Lock()
        self._closed = False
        self._attach(reader, writer)

    def _attach(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._lost: str | None = None
        self._reader_task = asyncio.create_task(self._read_responses(), name=f"poolgate-client {self.address}")

    @classmethod
    async def connect(cls, address: str, *, timeout: float = 10.0, token: str | None = None,
                      tls: ssl.SSLContext | None = None, server_name: str | None = None) -> "WorkerClient":
        """Dial ``address``; with ``token``, return once the worker accepted it; with ``tls``, over TLS
        (``server_name``: the name the worker's certificate carries, default the host dialed)."""
        dialer = _Dialer(address, timeout, token, tls, server_name)
        reader, writer = await dialer.dial()
        return cls(address, reader, writer, connect_timeout=timeout, dialer=dialer)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def connected(self) -> bool:
        return self._lost is None

    async def info(self) -> ModelInfo:
        result, _ = await self._request({"op": "info"})
        return ModelInfo.from_wire(result)

    async def health(self) -> dict:
        result, _ = await self._request({"op": "health"})
        return result

    async def pool(self, call: PoolingCall) -> PoolingResult:
        result, arrays = await self._request({"op": "pool", "call": call.to_wire()})
        try:
            outputs = Rows.from_arrays(arrays)
        except ValueError as exc:
            raise InternalError(f"worker sent malformed outputs: {exc}") from None
        if len(outputs) != len(result["prompt_tokens"]) or len(outputs) != len(call.inputs):
            raise InternalError(f"worker sent {len(outputs)} outputs for {len(call.inputs)} inputs")
        return PoolingResult(outputs=outputs, prompt_tokens=list(result["prompt_tokens"]),
                             timings=dict(result.get("timings") or {}))

    async def tokenize(self, x: Input, *, add_special_tokens: bool = True,
                       return_token_strs: bool = False) -> tuple[list[int], list[str | None] | None]:
        """One text's (or chat's) token ids, and each id's token string when asked (the ``tokenize`` op)."""
        result, _ = await self._request({"op": "tokenize", "input": input_to_wire(x),
                                         "add_special_tokens": add_special_tokens,
                                         "return_token_strs": return_token_strs})
        return list(result["tokens"]), result.get("token_strs")

    async def detokenize(self, ids: list[int]) -> str:
        """The text of ``ids`` (the ``detokenize`` op)."""
        result, _ = await self._request({"op": "detokenize", "tokens": list(ids)})
        return result["prompt"]

    async def close(self) -> None:
        self._closed = True
        self._fail_pending("connection closed by the gateway")
        self._reader_task.cancel()
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (OSError, asyncio.CancelledError):
            pass

    async def _request(self, header: dict) -> tuple[dict, list[np.ndarray]]:
        if self._lost is not None:
            await self._reconnect()
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._writer.write(encode_frame({"id": rid, **header}))
            async with self._drain_lock:
                await self._writer.drain()
            response, arrays = await future
        except asyncio.CancelledError:
            if self._lost is None and rid in self._pending:
                self._writer.write(encode_frame({"id": rid, "op": "cancel"}))
            raise
        except OSError as exc:  # the write side broke before the reader noticed
            raise Unavailable(f"worker at {self.address}: {exc}") from exc
        finally:
            self._pending.pop(rid, None)
        if not response.get("ok"):
            error = from_wire(response.get("error") or {})
            if isinstance(error, Unauthorized):  # the worker refused this connection, not the HTTP caller
                raise Unavailable(f"worker at {self.address} refused the connection: {error}")
            raise error
        return response.get("result") or {}, arrays

    async def _reconnect(self) -> None:
        """After a lost connection, dial again once per request (a restarted worker comes back)."""
        async with self._connect_lock:
            if self._lost is None:
                return
            if self._closed:
                raise Unavailable(f"worker at {self.address}: client is closed")
            self._attach(*await self._dialer.dial())

    async def _read_responses(self) -> None:
        reason = "connection closed by the worker"
        try:
            while True:
                head, payload = await read_frame(self._reader)
                header, arrays = decode_frame(head, payload)
                future = self._pending.get(header.get("id"))
                if future is not None and not future.done():
                    future.set_result((header, arrays))
        except asyncio.IncompleteReadError:
            pass
        except asyncio.CancelledError:
            reason = "connection closed by the gateway"
        except Exception as exc:  # reset, bad frame: the stream cannot be trusted any more
            reason = f"connection lost: {exc or type(exc).__name__}"
        self._fail_pending(reason)
        self._writer.close()

    def _fail_pending(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(Unavailable(f"worker at {self.address}: {self._lost}"))
