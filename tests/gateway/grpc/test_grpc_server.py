"""The gRPC server's own services and plumbing: grpc.health.v1, server reflection (what grpcurl lists), TLS with
the worker transport's PEM files, and each call's telemetry record (the caller's traceparent, protocol="grpc")."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from poolgate.gateway.telemetry.record import Telemetry
from poolgate.gateway.telemetry.tracing import span_attributes
from poolgate.shared.config.frozen import GatewayConfig, GrpcConfig
from tests.fakes import fake_model
from tests.tls_certs import make_pki

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def test_health_per_service(grpc_gateway):
    served = await grpc_gateway()  # an embedder
    health = health_pb2_grpc.HealthStub(served.channel)

    async def status(service: str) -> int:
        return (await health.Check(health_pb2.HealthCheckRequest(service=service))).status

    assert await status("") == SERVING
    assert await status("tei.v1.Embed") == SERVING
    assert await status("inference.GRPCInferenceService") == SERVING
    assert await status("tei.v1.Predict") == NOT_SERVING  # no classifier served
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await status("no.such.Service")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_and_describes_every_service(grpc_gateway):
    served = await grpc_gateway()

    def reflect():  # a blocking reflection client (as grpcurl is), in a thread beside the server's loop
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            db = ProtoReflectionDescriptorDatabase(channel)
            names = db.get_services()
            pool = descriptor_pool.DescriptorPool(db)
            embed = pool.FindServiceByName("tei.v1.Embed")
            infer = pool.FindServiceByName("inference.GRPCInferenceService").methods_by_name["ModelInfer"]
            return names, [m.name for m in embed.methods], infer.input_type.full_name

    names, methods, infer_input = await asyncio.to_thread(reflect)
    for service in ("tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Tokenize", "tei.v1.Info",
                    "inference.GRPCInferenceService", "grpc.health.v1.Health",
                    "grpc.reflection.v1alpha.ServerReflection"):
        assert service in names
    assert {"Embed", "EmbedStream", "EmbedSparse", "EmbedAll"} <= set(methods)
    assert infer_input == "inference.ModelInferRequest"


async def test_tls_with_the_worker_transport_pem_files(grpc_gateway, stubs, tmp_path):
    pki = make_pki(tmp_path / "pki")
    config = GatewayConfig(grpc=GrpcConfig(port=0, tls_cert=pki["cert"], tls_key=pki["key"]))
    with open(pki["ca"], "rb") as f:
        credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    served = await grpc_gateway(config=config, credentials=credentials, target_name="localhost")
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    assert len((await rpc.EmbedStub(served.channel).Embed(pb.EmbedRequest(inputs="x"))).embeddings) == 8
    plain = rpc.EmbedStub(grpc.aio.insecure_channel(f"localhost:{served.port}"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await plain.Embed(pb.EmbedRequest(inputs="x"), timeout=3)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class Recording:
    """A tracer and recorder that keep what they saw."""

    def __init__(self):
        self.headers, self.ended, self.observed = [], [], []

    def start(self, record, headers):
        self.headers.append(dict(headers))

    def end(self, record):
        self.ended.append(record)

    def observe(self, record):
        self.observed.append(record)


async def test_each_call_is_recorded_with_the_callers_trace_context(grpc_gateway, stubs):
    pb, rpc = stubs["tei_pb2"], stubs["tei_pb2_grpc"]
    seen = Recording()
    served = await grpc_gateway(models=[fake_model()], telemetry=Telemetry(tracer=seen, recorder=seen))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    embed = rpc.EmbedStub(served.channel)
    await embed.Embed(pb.EmbedRequest(inputs="x"), metadata=(("traceparent", parent), ("x-request-id", "abc")))
    assert seen.headers[-1]["traceparent"] == parent
    record = seen.observed[-1]
    assert (record.protocol, record.route, record.request_id, record.status) == ("grpc", "/tei.v1.Embed/Embed",
                                                                                 "abc", 200)
    assert record.model == "fake-model" and record.prompt_tokens > 0 and record.grpc_code == 0
    attrs = span_attributes(record)
    assert attrs["rpc.grpc.status_code"] == 0 and "http.response.status_code" not in attrs
    with pytest.raises(grpc.aio.AioRpcError):
        await embed.Embed(pb.EmbedRequest(inputs="x"), metadata=(("x-poolgate-model", "nope"),))
    failed = seen.observed[-1]
    assert (failed.status, failed.grpc_code, failed.error_type) == (404, grpc.StatusCode.NOT_FOUND.value[0],
                                                                    "model_not_found")
    answers = [a async for a in embed.EmbedStream(iter([pb.EmbedRequest(inputs=f"t{i}") for i in range(5)]))]
    assert len(answers) == 5
    batches = [r for r in seen.observed if r.route == "/tei.v1.Embed/EmbedStream" and r.prompt_tokens]
    assert sum(r.prompt_tokens for r in batches) == sum(a.metadata.compute_tokens for a in answers)
