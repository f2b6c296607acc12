"""Who may use a worker's transport: the listener (TLS, owner-only Unix socket) and the token hello.

With a token, a connection's first frame must be the ``hello`` carrying it
(at most ``MAX_HELLO_BYTES``, within ``HELLO_TIMEOUT_S``); anything else gets
an ``Unauthorized`` error frame naming the cause, a warning in the log (never
the token), and the connection closes. With a certificate and key the TCP
listener runs TLS. A TCP listener bound beyond loopback without a token
refuses to start unless ``insecure_no_token``. A Unix socket is bound under
umask 077, so it is owner-only from the first instant (then 0600), in a
folder created 0700 when it did not exist.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
from typing import Awaitable, Callable

from poolgate.shared.config.frozen import TransportSecurity
from poolgate.shared.domain.errors import PoolgateError, Unauthorized
from poolgate.shared.wire.transport import parse_address, read_frame
from poolgate.shared.wire.transport_security import (HELLO_ID, HELLO_TIMEOUT_S, MAX_HELLO_BYTES, is_loopback,
                                                server_context, tokens_match)
from poolgate.shared.wire.messages import decode_frame, encode_frame

log = logging.getLogger("poolgate.worker.server")

OnConnect = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def error_frame(rid, exc: PoolgateError) -> bytes:
    return encode_frame({"id": rid, "ok": False, "error": exc.to_wire()})


async def listen(address: str, on_connect: OnConnect, security: TransportSecurity) -> asyncio.Server:
    """Start the listener on ``address`` (see the module docstring for the rules it enforces)."""
    addr = parse_address(address)
    tls = server_context(security)
    if addr.kind == "unix":
        if tls is not None:
            raise ValueError("TLS is for TCP listeners; a Unix socket is protected by its file permissions")
        return await asyncio.start_unix_server(on_connect, sock=bind_private_unix(addr.path))
    server = await asyncio.start_server(on_connect, addr.host, addr.port, ssl=tls)
    exposed = sorted({s.getsockname()[0] for s in server.sockets if not is_loopback(s.getsockname()[0])})
    if exposed and security.token is None and not security.insecure_no_token:
        server.close()
        raise ValueError(f"refusing to listen on {address} ({', '.join(exposed)}) without a token: anyone who "
                         "can reach it could use the worker. Give a token (--token-file or POOLGATE_WORKER_TOKEN), "
                         "listen on 127.0.0.1, or pass --insecure-no-token")
    if exposed and security.token is None:
        log.warning("listening on %s without a token (--insecure-no-token): anyone who can reach it can use it",
                    address)
    return server


def hello_refusal(header: object, token: str) -> str | None:
    """Why a first frame does not authenticate the connection; None when it carries ``token``."""
    if not isinstance(header, dict) or header.get("op") != "hello":
        return "this worker requires a token: the first frame must be a hello carrying it (give the gateway the token)"
    if header.get("token") is None:
        return "this worker requires a token and the hello carried none"
    if not tokens_match(token, header["token"]):
        return "wrong token"
    return None


async def authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, token: str) -> bool:
    """Read the hello and check its token; on failure answer why, log it, close, and return False."""
    peer = writer.get_extra_info("peername") or "a Unix socket peer"
    header = None
    try:
        header, _ = decode_frame(*await asyncio.wait_for(read_frame(reader, MAX_HELLO_BYTES), HELLO_TIMEOUT_S))
        reason = hello_refusal(header, token)
    except asyncio.TimeoutError:
        reason = f"no hello within {HELLO_TIMEOUT_S:g} s"
    except asyncio.CancelledError:  # the worker is shutting down; ending quietly spares 3.11 an error log
        writer.close()
        return False
    except asyncio.IncompleteReadError as exc:
        # closed before a whole frame; with no byte at all it is a TCP probe (Kubernetes, a load balancer)
        (log.warning if exc.partial else log.debug)("closed an unauthenticated connection from %s: %s", peer, exc)
        writer.close()
        return False
    except Exception as exc:  # a garbage or oversized frame: nobody to answer
        log.warning("closed an unauthenticated connection from %s: %s", peer, exc or type(exc).__name__)
        writer.close()
        return False
    if reason is None:
        writer.write(encode_frame({"id": HELLO_ID, "ok": True, "result": {}}))
        return True
    log.warning("refused a transport connection from %s: %s", peer, reason)
    rid = header.get("id") if isinstance(header, dict) and isinstance(header.get("id"), int) else HELLO_ID
    writer.write(error_frame(rid, Unauthorized(reason)))
    try:
        await writer.drain()
    except OSError:
        pass
    writer.close()
    return False


def bind_private_unix(path: str) -> socket.socket:
    """A Unix socket bound at ``path``, mode 0600 from the start (umask 077 around ``bind``)."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700)
    else:
        mode = os.stat(folder).st_mode
        if mode & 0o022 and not mode & stat.S_ISVTX:
            log.warning("the socket's folder %s is writable by others: they could replace the socket", folder)
    _remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        sock.bind(path)  # created 0700 (0777 & ~077): nobody else can connect from the first instant
        os.chmod(path, 0o600)  # and no execute bit, which a socket does not use
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old)
    return sock


def _remove_stale_socket(path: str) -> None:
    """Unlink a socket file left by a dead worker; refuse to steal a live one's."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return  # not a socket: let bind fail with a clear error
    except FileNotFoundError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise OSError(f"another process is already serving on unix:{path}")
