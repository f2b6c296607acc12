"""The gateway's client for the gateway↔worker transport: addresses, frames, multiplexed calls.

Addresses, framing and the dial are ``shared.wire.connection``'s (re-exported
here). Every message is one ``shared.wire.messages`` frame. A request header is ``{"id", "op", "call"?}`` with
``op`` in ``pool | info | health | cancel`` (and ``hello``, the token frame
that opens a connection). A ``pool`` request is a tokenized call
(``shared.wire.token_call``: its token ids ride as the frame's arrays); ``info``
with ``"tokenizer": true`` also answers the model's tokenizer files
(``shared.inputs.tokenizer_files``). A response header is
``{"id", "ok": true, "result"}`` (a call's outputs ride as the frame's arrays:
one ``Rows`` block, never one array per sequence; a multi-output call's further blocks follow it,
their array counts in the result's ``more``) or
``{"id", "ok": false, "error": PoolgateError.to_wire()}``. Many requests share
one connection, matched by id; ``cancel`` (no response) tells the worker the
caller left so it drops that request's sequences. Losing the connection fails
every pending call with ``Unavailable``.

Security (``shared.wire.transport_security``): with a token, ``connect`` returns
only once the worker accepted it; with an ``ssl.SSLContext``, TCP connections
run TLS. A worker that refuses the client (wrong or missing token) is
``Unavailable`` with its reason, also when it refuses a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections.abc import Sequence
from typing import Any

import numpy as np

from poolgate.shared.domain.errors import InternalError, Unauthorized, Unavailable, from_wire
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.wire.connection import Address, Dialer, FrameError, open_stream, parse_address, read_frame
from poolgate.shared.wire.messages import ModelInfo, PoolingResult, decode_frame, encode_frame
from poolgate.shared.wire.rows import Rows
from poolgate.shared.wire.token_call import TokenCall

__all__ = ["Address", "FrameError", "WorkerClient", "open_stream", "parse_address", "read_frame"]


class WorkerClient:
    """One connection to one worker, with any number of requests in flight.

    After the connection is lost, the next request dials again once, so a
    worker restarted at the same address is reached without a new client.
    """

    def __init__(
        self,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        connect_timeout: float = 10.0,
        dialer: Dialer | None = None,
    ):
        self.address = address
        self.connect_timeout = connect_timeout
        self._dialer = dialer or Dialer(address, connect_timeout)
        self._pending: dict[int, asyncio.Future[tuple[dict[str, Any], list[np.ndarray]]]] = {}
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
    async def connect(
        cls,
        address: str,
        *,
        timeout: float = 10.0,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> WorkerClient:
        """Dial ``address``; with ``token``, return once the worker accepted it; with ``tls``, over TLS
        (``server_name``: the name the worker's certificate carries, default the host dialed)."""
        dialer = Dialer(address, timeout, token, tls, server_name)
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

    async def health(self) -> dict[str, Any]:
        result, _ = await self._request({"op": "health"})
        return result

    async def tokenizer(self) -> tuple[ModelInfo, TokenizerFiles]:
        """The worker's model info and its tokenizer files (the ``info`` op with ``tokenizer``)."""
        result, arrays = await self._request({"op": "info", "tokenizer": True})
        try:
            return ModelInfo.from_wire(result["info"]), TokenizerFiles.from_wire(result["tokenizer"], arrays[0])
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise InternalError(f"worker at {self.address} sent malformed tokenizer files: {exc}") from None

    async def lora(self, action: str, name: str, path: str | None = None) -> None:
        """Load (``path``: the adapter's folder on the worker's host) or unload run-time LoRA adapter ``name``."""
        await self._request({"op": "lora", "action": action, "name": name, "path": path})

    async def pool(self, call: TokenCall) -> PoolingResult:
        """The worker's answer to a tokenized call: one row and one token count per sequence."""
        header, blocks = call.to_wire()
        result, arrays = await self._request({"op": "pool", "call": header}, blocks)
        more = _more_blocks(result, arrays, len(call.params.outputs))
        try:
            outputs = Rows.from_arrays(arrays[: len(arrays) - sum(len(block) for block in more)])
            more_rows = [Rows.from_arrays(block) for block in more]
        except ValueError as exc:
            raise InternalError(f"worker sent malformed outputs: {exc}") from None
        n = len(call)
        if len(result["prompt_tokens"]) != n or any(len(r) != n for r in (outputs, *more_rows)):
            raise InternalError(f"worker sent {len(outputs)} outputs for {n} sequences")
        prompt_tokens = list(result["prompt_tokens"])
        return PoolingResult(
            outputs=outputs,
            prompt_tokens=prompt_tokens,
            timings=dict(result.get("timings") or {}),
            more=[PoolingResult(r, prompt_tokens) for r in more_rows],
        )

    async def close(self) -> None:
        self._closed = True
        self._fail_pending("connection closed by the gateway")
        self._reader_task.cancel()
        self._writer.close()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await self._writer.wait_closed()

    async def _request(
        self, header: dict[str, Any], blocks: Sequence[np.ndarray] = ()
    ) -> tuple[dict[str, Any], list[np.ndarray]]:
        if self._lost is not None:
            await self._reconnect()
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._writer.write(encode_frame({"id": rid, **header}, blocks))
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
                request_id = header.get("id")
                future = self._pending.get(request_id) if isinstance(request_id, int) else None
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


def _more_blocks(result: dict[str, Any], arrays: list[np.ndarray], expected: int) -> list[list[np.ndarray]]:
    """A multi-output call's further blocks: their arrays, the tail of ``arrays``."""
    specs = result.get("more") or []
    if len(specs) != expected:
        raise InternalError(f"worker sent {len(specs)} further outputs for the call's {expected}")
    counts = [int(spec["arrays"]) for spec in specs]
    at = len(arrays) - sum(counts)
    if at < 1 or min(counts, default=1) < 1:
        raise InternalError("worker sent malformed further outputs")
    blocks = []
    for count in counts:
        blocks.append(list(arrays[at : at + count]))
        at += count
    return blocks
