"""A malformed request (a NUL byte in a header) is one WARNING line without its bytes or a traceback, and a
flood of them is one line per window; the failure of many requests logs once too."""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.test_utils import TestServer

from poolgate.gateway.http import middleware, server_log
from poolgate.shared.domain.errors import Unavailable
from tests.gateway.http.test_middleware import fail_submits

SECRET = "sk-very-secret-key"


async def raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = await reader.read(64)
    writer.close()
    return answer


async def ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def test_nul_bytes_in_headers_are_one_warning_line_without_the_header(caplog):
    server_log.install()
    server_log.install()  # once
    app = web.Application()
    app.router.add_get("/", ok)
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    async with TestServer(app) as server:
        for _ in range(50):
            answer = await raw(server.port, f"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRET}\0x\r\n\r\n"
                               .encode())
            assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400")
    records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING and records[0].exc_info is None
    assert records[0].getMessage() == "malformed HTTP request from 127.0.0.1 (answered 400): Invalid header value char"
    assert SECRET not in caplog.text and "Traceback" not in caplog.text
    filters = [f for f in logging.getLogger("aiohttp.server").filters if isinstance(f, server_log.MalformedRequests)]
    assert len(filters) == 1


async def test_a_dead_pool_fails_many_requests_with_one_warning(gateway, caplog):
    client = await gateway()
    middleware._failures._seen.clear()
    fail_submits(client, Unavailable("worker unix:/w.sock is gone"))
    with caplog.at_level(logging.WARNING, logger="poolgate.gateway.http.middleware"):
        for _ in range(40):
            assert (await client.post("/v1/embeddings", json={"input": "x"})).status == 503
    lines = [r.getMessage() for r in caplog.records if r.name == "poolgate.gateway.http.middleware"]
    assert len(lines) == 1 and "503 worker unix:/w.sock is gone" in lines[0]
