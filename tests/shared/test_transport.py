"""WorkerClient against a real worker server (Engine over the fake model) over a Unix socket and TCP."""
from __future__ import annotations

import asyncio
import shutil
import tempfile

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from poolgate.shared.domain.errors import ContextLengthExceeded, InternalError, InvalidRequest, Unavailable
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.transport import Address, WorkerClient, parse_address, read_frame
from poolgate.shared.wire.token_call import TokenCall
from poolgate.shared.wire.messages import PREFIX, PoolingCall, decode_frame, encode_frame
from poolgate.workers.engine.engine import Engine
from poolgate.workers.server import bound_address, serve
from tests.fakes import CLS, FAIL_TOKEN, SEP, fake_ids, fake_model, fake_vector, tokenized, until


def call(*inputs, **params) -> TokenCall:
    return tokenized(PoolingCall(request_id="r", model="fake-model", inputs=list(inputs), params=PoolingParams(**params)))


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="pg-")  # short: AF_UNIX paths are limited to ~107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["unix", "tcp"])
def listen(request, sock_dir) -> str:
    return f"unix:{sock_dir}/w.sock" if request.param == "unix" else "tcp://127.0.0.1:0"


@pytest.fixture
def model():
    return fake_model(max_batch_tokens=256)


@pytest.fixture
def runner(model):
    return model.runner


@pytest.fixture
async def worker(listen, model):
    """A started engine and server; yields the address to dial."""
    engine = Engine(model)
    await engine.start()
    server = await serve(listen, engine, model.info)
    yield bound_address(server)
    model.runner.release.set()
    server.close()
    await engine.stop()


@pytest.fixture
async def client(worker):
    c = await WorkerClient.connect(worker)
    yield c
    await c.close()


def test_parse_address():
    assert parse_address("unix:/tmp/w.sock") == Address("unix", path="/tmp/w.sock")
    assert parse_address("unix:///tmp/w.sock") == Address("unix", path="/tmp/w.sock")
    assert parse_address("tcp://10.0.0.2:7000") == Address("tcp", host="10.0.0.2", port=7000)
    assert parse_address("tcp://[::1]:7000") == Address("tcp", host="::1", port=7000)
    assert str(parse_address("tcp://worker-0.svc:7000")) == "tcp://worker-0.svc:7000"
    for bad in ["", "/tmp/w.sock", "unix:", "tcp://host", "tcp://:80", "tcp://h:x", "tcp://h:70000", "http://h:1"]:
        with pytest.raises(ValueError):
            parse_address(bad)


async def test_info(client, model):
    assert await client.info() == model.info
    assert client.address.startswith(("unix:", "tcp://"))


async def test_pool_round_trip_is_bit_exact(client, runner):
    result = await client.pool(call("hello world", [5, 6, 7]))
    assert result.prompt_tokens == [4, 3]
    assert result.outputs.values.shape == (2, 8) and result.outputs.values.dtype == np.float32
    expected = np.stack([fake_vector(fake_ids("hello world")), fake_vector([5, 6, 7])])
    assert result.outputs.values.tobytes() == expected.tobytes()


async def test_health_reports_load(client):
    health = await client.health()
    assert {k: v for k, v in health.items() if k != "pipeline"} == {
        "ready": True, "draining": False, "queued": 0, "queued_tokens": 0, "running": 0, "requests_waiting": 0, "requests_running": 0}
    assert health["pipeline"]["batches"] == 0


async def test_concurrent_requests_share_one_connection(client, runner):
    runner.release.clear()
    first = asyncio.create_task(client.pool(call([1])))
    await asyncio.to_thread(runner.entered.wait, 2)
    rest = [asyncio.create_task(client.pool(call([i + 10], f"w{i}"))) for i in range(20)]
    await until(lambda: client.in_flight == 21)
    health = await client.health()  # answered while 21 pool calls wait
    assert health["running"] == 1
    runner.release.set()
    results = await asyncio.gather(first, *rest)
    for i, result in enumerate(results[1:]):
        assert_array_equal(result.outputs.item(0), fake_vector([i + 10]))
    assert len(runner.batches) < 21  # the worker saw them concurrently and batched them
    assert client.in_flight == 0


async def test_typed_errors_arrive_as_the_same_class(client):
    with pytest.raises(ContextLengthExceeded) as err:
        await client.pool(call(list(range(1, 50))))
    assert type(err.value) is ContextLengthExceeded
    assert err.value.param == "input_tokens"
    assert "maximum context length is 32 tokens" in err.value.message
    with pytest.raises(InvalidRequest) as err:
        await client.pool(call("a", dimensions=4))
    assert err.value.param == "dimensions"
    with pytest.raises(InvalidRequest, match="Unsupported task"):
        await client.pool(call("a", task="classify"))


async def test_unexpected_exception_becomes_internal_error(client):
    with pytest.raises(InternalError, match="device fell over"):
        await client.pool(call([CLS, FAIL_TOKEN, SEP]))
    assert (await client.pool(call("fine"))).prompt_tokens == [3]


async def test_cancelled_call_is_dropped_by_the_worker(client, runner):
    runner.release.clear()
    first = asyncio.create_task(client.pool(call([1])))
    await asyncio.to_thread(runner.entered.wait, 2)
    leaving = asyncio.create_task(client.pool(call([4242])))
    await until(lambda: client.in_flight == 2)
    await asyncio.sleep(0.05)  # let the worker queue it
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    for _ in range(100):  # the worker drops it within a few loop turns
        if (await client.health())["queued"] == 0:
            break
        await asyncio.sleep(0.01)
    assert (await client.health())["queued"] == 0
    runner.release.set()
    await first
    assert all(s.token_ids != [4242] for batch in runner.batches for s in batch)


async def test_malformed_frames_do_not_kill_the_worker(worker):
    addr = parse_address(worker)
    if addr.kind == "unix":
        reader, writer = await asyncio.open_unix_connection(addr.path)
    else:
        reader, writer = await asyncio.open_connection(addr.host, addr.port)
    head = b"{not json"
    writer.write(PREFIX.pack(len(head), 0) + head)
    writer.write(encode_frame({"id": 1, "op": "teleport"}))
    writer.write(encode_frame({"id": 2, "op": "pool", "call": {"inputs": "no"}}))
    writer.write(encode_frame({"id": [1], "op": "cancel"}))  # unhashable id: still an error frame
    writer.write(encode_frame({"id": 3, "op": "info"}))
    replies = [decode_frame(*await read_frame(reader))[0] for _ in range(5)]
    by_id = {r["id"]: r for r in replies if r["id"] is not None}
    nameless = [r for r in replies if r["id"] is None]
    assert len(nameless) == 2 and all(r["error"]["class"] == "InvalidRequest" for r in nameless)
    assert by_id[1]["error"]["class"] == "InvalidRequest" and "teleport" in by_id[1]["error"]["message"]
    assert by_id[2]["error"]["class"] == "InvalidRequest"
    assert by_id[3]["ok"] and by_id[3]["result"]["served_model_name"] == "fake-model"
    writer.write(PREFIX.pack(2**31, 0))  # a header too large to be real: the stream is garbage
    assert await reader.read() == b""  # the worker closed this connection ...
    writer.close()
    fresh = await WorkerClient.connect(worker)  # ... and still serves new ones
    assert (await fresh.info()).served_model_name == "fake-model"
    await fresh.close()


async def hang_up_server(listen: str, received: list):
    """A 'worker' that reads one request frame, then drops the connection."""
    async def on_connect(reader, writer):
        received.append(decode_frame(*await read_frame(reader))[0])
        await asyncio.sleep(0.05)  # let more requests pile up
        writer.close()

    addr = parse_address(listen)
    if addr.kind == "unix":
        return await asyncio.start_unix_server(on_connect, path=addr.path)
    return await asyncio.start_server(on_connect, addr.host, addr.port)


async def test_connection_loss_fails_pending_calls(listen, model):
    received = []
    flaky = await hang_up_server(listen, received)
    address = bound_address(flaky)
    client = await WorkerClient.connect(address)
    calls = [asyncio.create_task(client.pool(call("a"))) for _ in range(3)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results), results
    assert received[0]["op"] == "pool" and received[0]["call"]["request_id"] == "r"  # its ids ride as arrays
    assert client.in_flight == 0 and not client.connected
    flaky.close()
    await flaky.wait_closed()
    with pytest.raises(Unavailable, match="cannot connect"):
        await client.health()  # nobody there: the redial fails fast
    # a worker back at the same address (a stale socket file is replaced) is reached on the next call
    engine = Engine(model)
    await engine.start()
    server = await serve(address, engine, model.info)
    try:
        assert (await client.pool(call("b"))).prompt_tokens == [3]
    finally:
        await client.close()
        server.close()
        await engine.stop()


async def test_connect_failure_is_unavailable(sock_dir):
    with pytest.raises(Unavailable, match="cannot connect"):
        await WorkerClient.connect(f"unix:{sock_dir}/nobody.sock")


async def test_close_fails_pending_and_later_calls(client, runner):
    runner.release.clear()
    pending = asyncio.create_task(client.pool(call("a")))
    await asyncio.to_thread(runner.entered.wait, 2)
    await client.close()
    with pytest.raises(Unavailable):
        await pending
    with pytest.raises(Unavailable):
        await client.info()


async def test_a_live_worker_socket_is_not_stolen(sock_dir, model):
    address = f"unix:{sock_dir}/w.sock"
    engine = Engine(model)
    await engine.start()
    server = await serve(address, engine, model.info)
    try:
        with pytest.raises(OSError, match="already serving"):
            await serve(address, engine, model.info)
        client = await WorkerClient.connect(address)  # the first worker still answers
        assert (await client.info()).served_model_name == "fake-model"
        await client.close()
    finally:
        server.close()
        await engine.stop()
