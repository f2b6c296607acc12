"""A test OTLP trace collector on 127.0.0.1: spans exported to it, decoded from protobuf, kept in a list.

``OtlpReceiver`` serves OTLP/HTTP (``POST /v1/traces``, an aiohttp app) and,
with ``grpc=True``, OTLP/gRPC too, each in a background thread, so a test's
own event loop (and a blocking ``force_flush``) never waits on it.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

SERVER = Span.SPAN_KIND_SERVER
INTERNAL = Span.SPAN_KIND_INTERNAL
STATUS_UNSET, STATUS_ERROR = Status.STATUS_CODE_UNSET, Status.STATUS_CODE_ERROR


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex
    span_id: str  # hex
    parent_span_id: str  # hex; "" for a root span
    trace_state: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict
    status: int
    service_name: str


def _value(v: AnyValue):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                out.append(ReceivedSpan(
                    name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(), trace_state=s.trace_state, kind=s.kind,
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    attributes={a.key: _value(a.value) for a in s.attributes}, status=s.status.code,
                    service_name=resource.get("service.name", "")))
    return out


class _GrpcService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: "OtlpReceiver"):
        self.receiver = receiver

    def Export(self, request, context):
        self.receiver.add(decode(request.SerializeToString()))
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """Use as a context manager; ``url`` (HTTP) and ``grpc_url`` are where exporters send."""

    def __init__(self, *, grpc: bool = False):
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._grpc = grpc
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._serve, name="otlp-receiver", daemon=True)
        self.url = self.grpc_url = ""

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self.spans.extend(spans)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def wait_for(self, predicate, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < end, f"spans not received in {timeout} s: {self.spans}"
            time.sleep(0.02)

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        self.add(decode(await request.read()))
        return web.Response(body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        assert self._ready.wait(10), "OTLP receiver did not start"
        if self._grpc:
            import grpc

            self._grpc_server = grpc.server(ThreadPoolExecutor(2))
            trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_GrpcService(self), self._grpc_server)
            port = self._grpc_server.add_insecure_port("127.0.0.1:0")
            self._grpc_server.start()
            self.grpc_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        if self._grpc:
            self._grpc_server.stop(0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
