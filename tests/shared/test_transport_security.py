"""Worker transport security against a real worker server: token hello, TLS, owner-only Unix sockets, the CLI edge."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from poolgate.shared.config.frozen import TransportSecurity, WorkerConfig
from poolgate.shared.domain.errors import Unavailable
from poolgate.shared.config.security_flags import (add_gateway_security_arguments, add_worker_security_arguments,
                                            gateway_security_from_args, worker_security_from_args)
from poolgate.shared.wire.transport import WorkerClient, parse_address
from poolgate.shared.wire.transport_security import client_context, is_loopback, read_token, tokens_match
from poolgate.shared.wire.messages import encode_frame
from poolgate.workers import listener
from poolgate.workers.engine.engine import Engine
from poolgate.workers.server import bound_address, serve
from tests.fakes import fake_model

pytest.importorskip("cryptography")
from tests.tls_certs import make_pki  # noqa: E402

TOKEN = "s3cret-token"


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="pg-")  # short: AF_UNIX paths are limited to ~107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def engine():
    model = fake_model(max_batch_tokens=256)
    eng = Engine(model)
    await eng.start()
    yield eng, model.info
    await eng.stop()


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki")


async def start(engine, address: str, **security) -> tuple[asyncio.Server, str]:
    eng, info = engine
    server = await serve(address, eng, info, TransportSecurity(**security))
    return server, bound_address(server)


@pytest.fixture(params=["unix", "tcp"])
def listen(request, sock_dir) -> str:
    return f"unix:{sock_dir}/w.sock" if request.param == "unix" else "tcp://127.0.0.1:0"


async def test_the_right_token_is_served(engine, listen):
    server, address = await start(engine, listen, token=TOKEN)
    try:
        client = await WorkerClient.connect(address, token=TOKEN)
        assert (await client.info()).served_model_name == "fake-model"
        await client.close()
    finally:
        server.close()


async def test_a_wrong_token_is_refused_with_its_reason(engine, listen, caplog):
    server, address = await start(engine, listen, token=TOKEN)
    try:
        with caplog.at_level(logging.WARNING, logger="poolgate.worker.server"):
            with pytest.raises(Unavailable, match="refused the connection: wrong token"):
                await WorkerClient.connect(address, token="not-it")
        assert any("wrong token" in r.getMessage() for r in caplog.records)
        assert not any("not-it" in r.getMessage() or TOKEN in r.getMessage() for r in caplog.records)
    finally:
        server.close()


async def test_no_token_is_refused_on_the_first_request(engine, listen):
    server, address = await start(engine, listen, token=TOKEN)
    try:
        client = await WorkerClient.connect(address)  # no hello: the first request is what the worker refuses
        with pytest.raises(Unavailable, match="refused the connection: this worker requires a token"):
            await client.info()
        await client.close()
        with pytest.raises(Unavailable, match="hello carried none"):
            await _hello_frame(address, {"id": 0, "op": "hello", "token": None})
    finally:
        server.close()


async def _open(address: str):
    addr = parse_address(address)
    if addr.kind == "unix":
        return await asyncio.open_unix_connection(addr.path)
    return await asyncio.open_connection(addr.host, addr.port)


async def _hello_frame(address: str, header: dict) -> None:
    from poolgate.shared.wire.transport import read_frame
    from poolgate.shared.wire.messages import decode_frame

    reader, writer = await _open(address)
    writer.write(encode_frame(header))
    reply, _ = decode_frame(*await read_frame(reader))
    assert await reader.read() == b""  # the worker closed the connection
    writer.close()
    raise Unavailable(reply["error"]["message"])


async def test_a_worker_without_a_token_accepts_a_client_with_one(engine, listen):
    server, address = await start(engine, listen)
    try:
        for token in (None, TOKEN):  # a gateway with a token for other workers still reaches this one
            client = await WorkerClient.connect(address, token=token)
            assert (await client.info()).served_model_name == "fake-model"
            await client.close()
    finally:
        server.close()


async def test_garbage_or_silence_before_the_hello_closes_the_connection(engine, monkeypatch):
    monkeypatch.setattr(listener, "HELLO_TIMEOUT_S", 0.2)
    server, address = await start(engine, "tcp://127.0.0.1:0", token=TOKEN)
    try:
        reader, writer = await _open(address)
        writer.write(encode_frame({"id": 0, "op": "hello", "token": "x" * (listener.MAX_HELLO_BYTES + 1)}))
        assert await asyncio.wait_for(reader.read(), 5) == b""  # oversized: closed without an answer
        reader, writer = await _open(address)
        assert b"no hello within" in await asyncio.wait_for(reader.read(), 5)  # silent: told why, then closed
        client = await WorkerClient.connect(address, token=TOKEN)  # the worker still serves
        assert (await client.info()).served_model_name == "fake-model"
        await client.close()
    finally:
        server.close()


async def test_a_worker_that_never_answers_the_hello_is_unavailable(sock_dir):
    async def silent(reader, writer):
        await reader.read()  # reads the hello, answers nothing

    server = await asyncio.start_unix_server(silent, path=f"{sock_dir}/silent.sock")
    try:
        with pytest.raises(Unavailable, match="did not answer the token hello within 0.2 s"):
            await WorkerClient.connect(f"unix:{sock_dir}/silent.sock", token=TOKEN, timeout=0.2)
    finally:
        server.close()


async def test_a_redial_after_a_lost_connection_sends_the_token_again(engine, sock_dir):
    address = f"unix:{sock_dir}/w.sock"
    server, address = await start(engine, address, token=TOKEN)
    client = await WorkerClient.connect(address, token=TOKEN)
    server.close()
    await server.wait_closed()
    client._writer.close()  # the connection drops (as when the worker restarts)
    await asyncio.sleep(0.05)
    assert not client.connected
    server, _ = await start(engine, address, token=TOKEN)
    try:
        assert (await client.info()).served_model_name == "fake-model"
    finally:
        await client.close()
        server.close()


async def test_tls_with_the_right_ca(engine, pki):
    server, address = await start(engine, "tcp://127.0.0.1:0", token=TOKEN, tls_cert=pki["cert"], tls_key=pki["key"])
    try:
        tls = client_context(TransportSecurity(tls=True, tls_ca=pki["ca"]))
        client = await WorkerClient.connect(address, token=TOKEN, tls=tls)
        assert (await client.info()).served_model_name == "fake-model"
        assert client._writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        await client.close()
        named = await WorkerClient.connect(address, token=TOKEN, tls=tls, server_name="localhost")
        await named.close()
    finally:
        server.close()


async def test_tls_with_a_wrong_ca_or_name_or_none_fails(engine, pki, tmp_path):
    server, address = await start(engine, "tcp://127.0.0.1:0", tls_cert=pki["cert"], tls_key=pki["key"])
    try:
        other = make_pki(tmp_path / "other", ca_name="someone else")
        with pytest.raises(Unavailable, match="certificate verify failed"):
            await WorkerClient.connect(address, tls=client_context(TransportSecurity(tls=True, tls_ca=other["ca"])))
        with pytest.raises(Unavailable, match="certificate verify failed"):  # the system store does not know it
            await WorkerClient.connect(address, tls=client_context(TransportSecurity(tls=True)))
        with pytest.raises(Unavailable, match="certificate verify failed|match"):
            await WorkerClient.connect(address, server_name="gpu-host-3",
                                       tls=client_context(TransportSecurity(tls=True, tls_ca=pki["ca"])))
        with pytest.raises(Unavailable):  # plain text to a TLS listener: no answer that parses
            client = await WorkerClient.connect(address, timeout=2)
            await asyncio.wait_for(client.info(), 2)
    finally:
        server.close()


async def test_tls_is_refused_on_a_unix_socket_and_needs_both_files(engine, sock_dir, pki):
    with pytest.raises(ValueError, match="TLS is for TCP"):
        await start(engine, f"unix:{sock_dir}/w.sock", tls_cert=pki["cert"], tls_key=pki["key"])
    with pytest.raises(ValueError, match="both"):
        await start(engine, "tcp://127.0.0.1:0", tls_cert=pki["cert"])


async def test_unix_socket_is_owner_only_from_bind(engine, sock_dir, monkeypatch):
    modes = []
    real_bind = listener.socket.socket.bind

    class Spy(listener.socket.socket):
        def bind(self, path):
            real_bind(self, path)
            modes.append(stat.S_IMODE(os.stat(path).st_mode))  # the mode the instant the file exists

    monkeypatch.setattr(listener.socket, "socket", Spy)
    before = os.umask(0o022)
    try:
        server, address = await start(engine, f"unix:{sock_dir}/new/w.sock")
        assert os.umask(0o022) == 0o022  # the process umask is restored
    finally:
        os.umask(before)
    try:
        assert len(modes) == 1 and modes[0] & 0o077 == 0  # nobody else could connect, even before chmod
        assert stat.S_IMODE(os.stat(f"{sock_dir}/new/w.sock").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(f"{sock_dir}/new").st_mode) == 0o700  # the folder it created
    finally:
        server.close()


async def test_non_loopback_tcp_needs_a_token(engine):
    with pytest.raises(ValueError, match="without a token"):
        await start(engine, "tcp://0.0.0.0:0")
    for security in ({"token": TOKEN}, {"insecure_no_token": True}):
        server, _ = await start(engine, "tcp://0.0.0.0:0", **security)
        server.close()
    server, _ = await start(engine, "tcp://127.0.0.1:0")  # loopback alone needs nothing
    server.close()


def test_helpers():
    assert tokens_match("abc", "abc") and not tokens_match("abc", "abd") and not tokens_match("abc", None)
    assert not tokens_match("abc", 123)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    assert not is_loopback("gpu-host-3")


def test_token_from_file_or_env(tmp_path):
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    assert read_token(str(path), {"POOLGATE_WORKER_TOKEN": "env"}) == TOKEN  # the file wins
    assert read_token(None, {"POOLGATE_WORKER_TOKEN": " env "}) == "env"
    assert read_token(None, {}) is None
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_token(str(path), {})
    with pytest.raises(FileNotFoundError):
        read_token(str(tmp_path / "missing"), {})


def _worker_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen")
    add_worker_security_arguments(parser)
    return parser.parse_args(list(argv))


def test_worker_security_flags(tmp_path, pki):
    path = tmp_path / "token"
    path.write_text(TOKEN)
    sec = worker_security_from_args(_worker_args("--listen", "tcp://0.0.0.0:9100", "--token-file", str(path),
                                                 "--tls-cert", pki["cert"], "--tls-key", pki["key"]), {})
    assert (sec.token, sec.tls_cert, sec.tls_key) == (TOKEN, pki["cert"], pki["key"])
    assert TOKEN not in repr(sec)
    with pytest.raises(ValueError, match="needs a token"):
        worker_security_from_args(_worker_args("--listen", "tcp://0.0.0.0:9100"), {})
    assert worker_security_from_args(_worker_args("--listen", "tcp://0.0.0.0:9100", "--insecure-no-token"),
                                     {}).insecure_no_token
    assert worker_security_from_args(_worker_args("--listen", "tcp://0.0.0.0:9100"),
                                     {"POOLGATE_WORKER_TOKEN": TOKEN}).token == TOKEN
    assert worker_security_from_args(_worker_args("--listen", "tcp://127.0.0.1:9100"), {}).token is None
    with pytest.raises(ValueError, match="go together"):
        worker_security_from_args(_worker_args("--listen", "tcp://127.0.0.1:1", "--tls-cert", pki["cert"]), {})
    with pytest.raises(ValueError, match="tcp:// listener"):
        worker_security_from_args(_worker_args("--listen", "unix:/tmp/w.sock", "--tls-cert", pki["cert"],
                                               "--tls-key", pki["key"]), {})


def test_gateway_security_flags(tmp_path, pki):
    parser = argparse.ArgumentParser()
    add_gateway_security_arguments(parser)
    path = tmp_path / "token"
    path.write_text(TOKEN)
    sec = gateway_security_from_args(parser.parse_args(
        ["--worker-token-file", str(path), "--worker-tls", "--worker-tls-ca", pki["ca"],
         "--worker-tls-server-name", "poolgate-workers"]), {})
    assert sec == TransportSecurity(token=TOKEN, tls=True, tls_ca=pki["ca"], tls_server_name="poolgate-workers")
    with pytest.raises(ValueError, match="needs --worker-tls"):
        gateway_security_from_args(parser.parse_args(["--worker-tls-ca", pki["ca"]]), {})


def test_the_worker_config_carries_its_security_over_the_wire_but_not_into_repr():
    cfg = WorkerConfig(model="/m", served_model_name="m", security=TransportSecurity(token=TOKEN))
    assert WorkerConfig.from_wire(cfg.to_wire()) == cfg
    assert TOKEN not in repr(cfg)
    assert WorkerConfig.from_wire({k: v for k, v in cfg.to_wire().items() if k != "security"}).security.token is None


def test_poolgate_worker_refuses_a_public_listener_without_a_token():
    out = subprocess.run([sys.executable, "-m", "poolgate.gateway.cli", "worker", "--listen", "tcp://0.0.0.0:9",
                          "--runner-factory", "tests.workers.fake_factory:build"],
                         capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "POOLGATE_WORKER_TOKEN"})
    assert out.returncode == 2 and "needs a token" in out.stderr, out.stderr
