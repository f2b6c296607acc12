"""gRPC test helpers: a client generated from the shipped protos with grpcio-tools at test time, and a gateway
serving gRPC (the real app, router and gRPC server) over real workers in this process."""
from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.grpc.server import GrpcServer
from poolgate.gateway.telemetry.record import Telemetry
from poolgate.shared.config.frozen import GatewayConfig, GrpcConfig
from tests.fakes import fake_model
from tests.gateway.conftest import served_router

PROTOS = Path(__file__).resolve().parents[3] / "gateway" / "grpc"


@pytest.fixture(scope="session")
def stubs(tmp_path_factory) -> dict[str, ModuleType]:
    """``tei_pb2``, ``tei_pb2_grpc``: generated now by grpcio-tools' protoc from the tei.proto the server ships
    (as a user of TEI's proto would). The inference protocol's client is tritonclient's own (its proto's
    messages share the ``inference`` package, so a second generated copy would clash in protobuf's pool)."""
    out = tmp_path_factory.mktemp("stubs")
    for proto in ("tei.proto",):
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTOS}", f"--python_out={out}",
                        f"--grpc_python_out={out}", proto], check=True)
    sys.path.insert(0, str(out))
    try:
        return {name: importlib.import_module(name)
                for name in ("tei_pb2", "tei_pb2_grpc")}
    finally:
        sys.path.remove(str(out))


@dataclass
class Served:
    http: TestClient
    channel: grpc.aio.Channel
    server: GrpcServer
    app: object
    port: int


@pytest.fixture
async def grpc_gateway():
    """``await grpc_gateway(config=..., models=[...], telemetry=..., credentials=...)`` -> ``Served``: the app on
    an HTTP test server and on a gRPC server (port 0), and an aio channel to it."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(*, config: GatewayConfig | None = None, models=None, telemetry: Telemetry | None = None,
                        credentials: grpc.ChannelCredentials | None = None, target_name: str | None = None,
                        stream_inflight: int = 256) -> Served:
            config = config or GatewayConfig()
            if config.grpc is None:
                config = replace(config, grpc=GrpcConfig(port=0, stream_inflight=stream_inflight))
            router = await stack.enter_async_context(served_router(models or [fake_model()]))
            app = make_app(config, router, telemetry=telemetry)
            http = TestClient(TestServer(app))
            await http.start_server()
            stack.push_async_callback(http.close)
            server = GrpcServer(config)
            port = await server.start(app)
            stack.push_async_callback(server.stop)
            address = f"127.0.0.1:{port}" if target_name is None else f"{target_name}:{port}"
            channel = (grpc.aio.insecure_channel(address) if credentials is None
                       else grpc.aio.secure_channel(address, credentials))
            stack.push_async_callback(channel.close)
            return Served(http, channel, server, app, port)

        yield start
