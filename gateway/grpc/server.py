"""The gateway's gRPC server (``--grpc-port``): grpcio's asyncio server on the HTTP app's own event loop.

It serves, beside HTTP and through the same serving path (``gateway.grpc.call``):

- TEI's ``tei.v1`` services (``gateway.grpc.tei``);
- the Open Inference Protocol's ``inference.GRPCInferenceService``
  (``gateway.grpc.oip``), which tritonclient.grpc calls;
- ``grpc.health.v1.Health``: the server (``""``) and ``inference.GRPCInferenceService``
  are SERVING once every model has a ready worker; ``tei.v1.Info`` and
  ``tei.v1.Tokenize`` once some model is loaded (they need its tokenizer only); ``tei.v1.Embed``,
  ``tei.v1.Predict`` and ``tei.v1.Rerank`` when ready and some served model
  does that (an embedder; a classifier; a reranker, or an embedder scoring by
  cosine as ``/rerank`` does), as TEI reports per model type. A draining gateway (SIGTERM) is NOT_SERVING everywhere;
- server reflection (``grpc.reflection.v1alpha``, the version grpcio-reflection
  ships; grpcurl falls back to it), listing every service above.

The protos are compiled at start (``gateway.grpc.protos``); every method is
registered with grpcio's generic handlers. ``--grpc-tls-cert`` / ``--grpc-tls-key``
serve TLS (the same PEM files the worker transport's ``--tls-cert`` takes).
Messages may be as large as ``--max-request-bytes``. The port is bound with
SO_REUSEPORT (grpcio's default), so each of ``--gateway-processes N`` serves it.
At shutdown the server stops taking calls and gives the calls in flight the
drain timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from poolgate.gateway.grpc.oip import Oip
from poolgate.gateway.grpc.protos import Protos, load
from poolgate.gateway.grpc.tei import Tei
from poolgate.gateway.http.state import ROUTER
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.score_plan import scoring_enabled

log = logging.getLogger("poolgate.gateway.grpc")
HEALTH_INTERVAL_S = 0.5
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
OIP_SERVICE = "inference.GRPCInferenceService"

Table = dict[str, dict[str, tuple[str, Any, str, str]]]


def _method_handler(protos: Protos, service: str, kind: str, fn: Any, request: str, response: str) -> Any:
    from poolgate.gateway.grpc.handlers import parser

    package = service.rpartition(".")[0]
    parse = parser(protos.message(f"{package}.{request}"))
    serialize = protos.message(f"{package}.{response}").SerializeToString
    make = {
        "unary": grpc.unary_unary_rpc_method_handler,
        "stream": grpc.stream_stream_rpc_method_handler,
        "collect": grpc.stream_unary_rpc_method_handler,
    }[kind]
    return make(fn, request_deserializer=parse, response_serializer=serialize)


def services(app: web.Application, protos: Protos) -> Table:
    """Every poolgate service's methods: TEI's and the Open Inference Protocol's."""
    return {**Tei(app, protos).handlers(), **Oip(app, protos).handlers()}


def serving_status(app: web.Application, draining: bool) -> dict[str, int]:
    """Each health service name's status now (module doc)."""
    router = app[ROUTER]
    ready = router.ready and not draining
    models = router.models() if ready else []
    embeds = any("embed" in m.tasks for m in models)
    classifies = any("classify" in m.tasks for m in models)
    ranks = any(scoring_enabled(m) for m in models)  # a one-label classifier, or an embedder (cosine)
    on = {True: SERVING, False: NOT_SERVING}
    return {
        "": on[ready],
        OIP_SERVICE: on[ready],
        "tei.v1.Info": on[bool(router.pools) and not draining],  # a model's tokenizer is there
        "tei.v1.Tokenize": on[bool(router.pools) and not draining],
        "tei.v1.Embed": on[embeds],
        "tei.v1.Predict": on[classifies],
        "tei.v1.Rerank": on[ranks],
    }


def _credentials(config: GatewayConfig) -> grpc.ServerCredentials | None:
    grpc_config = config.grpc
    if grpc_config is None or grpc_config.tls_cert is None or grpc_config.tls_key is None:
        return None
    key, chain = Path(grpc_config.tls_key).read_bytes(), Path(grpc_config.tls_cert).read_bytes()
    return grpc.ssl_server_credentials([(key, chain)])


class GrpcServer:
    """The gRPC server of one gateway process; ``run`` is the app's cleanup_ctx (module doc)."""

    def __init__(self, config: GatewayConfig, draining: Any = None) -> None:
        if config.grpc is None:
            raise ValueError("no gRPC port configured")
        self.config, self.port = config, config.grpc.port
        self.draining = draining or (lambda: False)  # () -> bool: the gateway drains (SIGTERM)
        self.server: grpc.aio.Server | None = None
        self.health = HealthServicer()

    async def start(self, app: web.Application) -> int:
        """Bind and start; the port it listens on (``--grpc-port 0``: a free one)."""
        protos = load()
        limit = self.config.max_request_bytes
        server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1)]
        )
        table = services(app, protos)
        for service, methods in table.items():
            handlers = {name: _method_handler(protos, service, *entry) for name, entry in methods.items()}
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = [*table, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server, pool=protos.pool)
        address = f"{self.config.host}:{self.port}"
        credentials = _credentials(self.config)
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
        if port == 0:
            raise OSError(f"could not bind gRPC to {address}")
        await server.start()
        self.server, self.port = server, port
        await self._refresh(app)
        scheme = "grpcs" if credentials is not None else "grpc"
        log.info("gRPC on %s://%s:%d (tei.v1, %s, health, reflection)", scheme, self.config.host, port, OIP_SERVICE)
        return port

    async def _refresh(self, app: web.Application) -> None:
        for name, status in serving_status(app, self.draining()).items():
            await self.health.set(name, status)

    async def watch(self, app: web.Application) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await self._refresh(app)

    async def stop(self) -> None:
        if self.server is None:
            return
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self.config.drain_timeout_s)
        self.server = None

    async def run(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: serve gRPC for the app's lifetime."""
        await self.start(app)
        watcher = asyncio.create_task(self.watch(app))
        try:
            yield
        finally:
            watcher.cancel()
            await asyncio.wait([watcher])
            await self.stop()


def grpc_site(config: GatewayConfig, draining: Any = None) -> list:
    """The cleanup_ctx that serves gRPC when ``--grpc-port`` is set (none otherwise)."""
    return [GrpcServer(config, draining).run] if config.grpc is not None else []
