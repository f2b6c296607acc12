"""Bad input on gRPC gets the status the one table (gateway.grpc.status) gives its typed error, and leaves the
server's other calls alone: a malformed message, an unknown model, a missing or wrong key, an over-long input, a
tenant over its quota (RESOURCE_EXHAUSTED with RetryInfo), a deadline, a stream that sends forever, a client that
goes away mid-stream."""
from __future__ import annotations

import asyncio
import hashlib

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from poolgate.gateway.http.state import ROUTER
from poolgate.shared.config.frozen import GatewayConfig, Tenant
from tests.fakes import FakeRunner, fake_model


def in_flight(served) -> int:
    return sum(pool.in_flight(c) for pool in served.app[ROUTER].pools.values() for c in pool.clients)


async def idle(served, timeout_s: float = 5.0) -> None:
    """Wait until no call is in flight to the workers (the cancelled ones' work dropped); fail after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.1)):
        if in_flight(served) == 0:
            return
        await asyncio.sleep(0.1)
    assert in_flight(served) == 0


async def status_of(awaitable) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await awaitable
    return err.value


async def test_malformed_message_is_invalid_argument(grpc_gateway):
    served = await grpc_gateway()
    raw = served.channel.unary_unary("/tei.v1.Embed/Embed")  # bytes in, bytes out
    err = await status_of(raw(b"\x0a\xff\xff\xff\xff"))  # field 1 (string) with a length past the end
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not parse" in err.details()
    stream = served.channel.stream_stream("/tei.v1.Embed/EmbedStream")
    err = await status_of(_drain(stream(iter([b"\x0a\x01a", b"\x0a\xff\xff\xff"]))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


async def _drain(call) -> list:
    return [x async for x in call]


async def test_unknown_model_and_over_long_input(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway()  # max_model_len 32 tokens
    embed = rpc.EmbedStub(served.channel)
    err = await status_of(embed.Embed(pb.EmbedRequest(inputs="x"), metadata=(("x-poolgate-model", "nope"),)))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "nope" in err.details()
    long = " ".join(["word"] * 200)
    err = await status_of(embed.Embed(pb.EmbedRequest(inputs=long)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "maximum context length" in err.details()
    ok = await embed.Embed(pb.EmbedRequest(inputs=long, truncate=True))  # truncated, as on HTTP
    assert ok.metadata.compute_tokens == 32
    err = await status_of(_drain(embed.EmbedStream(iter([pb.EmbedRequest(inputs="fine"), pb.EmbedRequest(inputs=long)]))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_api_key_as_bearer_metadata(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    served = await grpc_gateway(config=GatewayConfig(api_key="sesame"))
    embed = rpc.EmbedStub(served.channel)
    err = await status_of(embed.Embed(pb.EmbedRequest(inputs="x")))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    err = await status_of(embed.Embed(pb.EmbedRequest(inputs="x"), metadata=(("authorization", "Bearer wrong"),)))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    err = await status_of(_drain(embed.EmbedStream(iter([pb.EmbedRequest(inputs="x")]))))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    got = await embed.Embed(pb.EmbedRequest(inputs="x"), metadata=(("authorization", "Bearer sesame"),))
    assert len(got.embeddings) == 8


async def test_tenant_over_quota_is_resource_exhausted_with_retry_info(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    tenant = Tenant("slow", (hashlib.sha256(b"k1").hexdigest(),), requests_per_minute=1)
    served = await grpc_gateway(config=GatewayConfig(tenants=(tenant,)))
    embed, key = rpc.EmbedStub(served.channel), (("authorization", "Bearer k1"),)
    await embed.Embed(pb.EmbedRequest(inputs="x"), metadata=key)
    err = await status_of(embed.Embed(pb.EmbedRequest(inputs="x"), metadata=key))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "quota" in err.details()
    trailers = dict(err.trailing_metadata())
    assert int(trailers["retry-after"]) >= 1
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info) and info.retry_delay.seconds == int(trailers["retry-after"])


async def test_grpc_deadline_is_the_request_deadline(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    runner = FakeRunner()
    served = await grpc_gateway(models=[fake_model(runner=runner)])
    runner.release.clear()  # every batch held on the "device"
    try:
        err = await status_of(rpc.EmbedStub(served.channel).Embed(pb.EmbedRequest(inputs="x"), timeout=0.5))
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        runner.release.set()
    await idle(served)


async def test_a_stream_that_sends_forever_is_bounded_and_others_go_on(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    runner = FakeRunner()
    runner.execute_delay = 0.02
    served = await grpc_gateway(models=[fake_model(runner=runner)], stream_inflight=4)
    embed = rpc.EmbedStub(served.channel)
    sent = 0

    def forever():
        nonlocal sent
        while True:
            sent += 1
            yield pb.EmbedRequest(inputs=f"text {sent}")

    def flood() -> grpc.RpcError:  # a blocking client (as TEI's are), in a thread beside the server's loop
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                for _ in rpc.EmbedStub(channel).EmbedStream(forever(), timeout=2.0):
                    pass
            return err.value

    flooding = asyncio.ensure_future(asyncio.to_thread(flood))
    await asyncio.sleep(0.5)
    assert len((await asyncio.wait_for(embed.Embed(pb.EmbedRequest(inputs="meanwhile")), 5)).embeddings) == 8
    err = await flooding
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    queued = sum(len(batch) for batch in runner.batches)
    assert queued < sent  # the server read only what it could answer; the client was held back
    await idle(served)


async def test_a_client_that_goes_away_cancels_its_queued_work(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    runner = FakeRunner()
    served = await grpc_gateway(models=[fake_model(runner=runner)])
    embed = rpc.EmbedStub(served.channel)
    runner.release.clear()
    call = embed.EmbedStream(iter([pb.EmbedRequest(inputs=f"t{i}") for i in range(50)]))
    await asyncio.sleep(0.5)
    assert in_flight(served) > 0
    call.cancel()
    runner.release.set()
    await idle(served)
    assert len((await embed.Embed(pb.EmbedRequest(inputs="after"))).embeddings) == 8
