"""One connection to a worker: addresses, frames on a byte stream, and the dial (TLS, token hello).

Addresses are ``unix:/path/to.sock`` or ``tcp://host:port``. ``Dialer`` opens a
connection the way a ``WorkerClient`` needs it, for the first connect and every
redial: over TLS when given an ``ssl.SSLContext`` (TCP only), then, with a
token, the ``hello`` frame (``shared.wire.transport_security``), returning only
once the worker accepted it. Every failure is ``Unavailable`` with its cause.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass

from poolgate.shared.domain.errors import Unavailable
from poolgate.shared.wire.messages import MAX_HEADER_BYTES, PREFIX, decode_frame, encode_frame
from poolgate.shared.wire.transport_security import HELLO_ID, MAX_HELLO_BYTES


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
        path = address[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ValueError(f"unix address needs a socket path: {address!r}")
        return Address("unix", path=path)
    if address.startswith("tcp://"):
        host, sep, port = address[len("tcp://") :].rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"tcp address must be tcp://host:port, got {address!r}")
        return Address("tcp", host=host, port=int(port))
    raise ValueError(f"transport address must start with unix: or tcp://, got {address!r}")


async def open_stream(
    address: str,
    tls: ssl.SSLContext | None = None,
    server_name: str | None = None,
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
class Dialer:
    """How one client reaches its worker: address, timeout, token and TLS (also for redials)."""

    address: str
    timeout: float
    token: str | None = None
    tls: ssl.SSLContext | None = None
    server_name: str | None = None

    async def dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.wait_for(open_stream(self.address, self.tls, self.server_name), self.timeout)
        except (TimeoutError, OSError) as exc:
            raise Unavailable(f"cannot connect to worker at {self.address}: {exc or type(exc).__name__}") from exc
        if self.token is not None:
            try:
                await asyncio.wait_for(self._hello(reader, writer), self.timeout)
            except TimeoutError:
                writer.close()
                raise Unavailable(
                    f"worker at {self.address} did not answer the token hello within {self.timeout:g} s"
                ) from None
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
            raise Unavailable(f"worker at {self.address} dropped the handshake: {exc or type(exc).__name__}") from exc
        if not isinstance(reply, dict) or not reply.get("ok"):
            error = reply.get("error") if isinstance(reply, dict) else None
            reason = error.get("message", "no reason given") if isinstance(error, dict) else "no reason given"
            raise Unavailable(f"worker at {self.address} refused the connection: {reason}")
