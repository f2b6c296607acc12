"""The llm_request span, exported over real OTLP/HTTP (and gRPC) to a receiver on 127.0.0.1.

The gateway app runs on a real port over real workers (transport + Engine
around the fake runner); with ``detailed``, the worker's engine exports the
child spans tokenize / queue / forward / pool to the same receiver.
"""
from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile

import aiohttp
import pytest

from poolgate.gateway.app import make_app
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.gateway.telemetry.record import Telemetry
from poolgate.gateway.telemetry.tracing import build_tracer
from poolgate.shared.telemetry import names
from poolgate.shared.inputs.front import Front
from poolgate.shared.config.frozen import GatewayConfig, TracingConfig
from poolgate.shared.wire.transport import WorkerClient
from poolgate.workers.engine.engine import Engine
from poolgate.workers.server import serve
from poolgate.workers.engine.tracing import CallSpans
from tests.fakes import CLS, FAIL_TOKEN, fake_model
from tests.gateway.conftest import served_router
from tests.otlp_receiver import INTERNAL, SERVER, STATUS_ERROR, STATUS_UNSET, OtlpReceiver

LONG = " ".join(f"w{i}" for i in range(40))  # over the fake model's 32 tokens


def traceparent(sampled: bool = True) -> tuple[str, str, str]:
    """(header, trace id, parent span id) of a caller's span."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


@pytest.fixture
def receiver():
    with OtlpReceiver(grpc=True) as r:
        yield r


@pytest.fixture
async def traced(receiver, live_server):
    """``await traced(detailed=False, protocol=...)`` -> (base URL, flush); flush exports every ended span."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(*, detailed: bool = False, protocol: str = "http/protobuf"):
            endpoint = receiver.url if protocol == "http/protobuf" else receiver.grpc_url
            cfg = TracingConfig(endpoint=endpoint, protocol=protocol, detailed=detailed)
            tracer = build_tracer(cfg)
            stack.callback(tracer.shutdown)
            providers = [tracer]
            if detailed:
                spans = CallSpans(cfg)
                stack.callback(spans.shutdown)
                providers.append(spans)
                router = await stack.enter_async_context(traced_worker_router(spans))
            else:
                router = await stack.enter_async_context(served_router([fake_model()]))
            url = await live_server(make_app(GatewayConfig(), router, telemetry=Telemetry(tracer=tracer)))

            async def flush() -> None:
                for p in providers:
                    assert await asyncio.to_thread(p.force_flush)

            return url, flush

        yield start


@contextlib.asynccontextmanager
async def traced_worker_router(spans: CallSpans):
    """A Router over one real worker whose Engine exports detailed spans through ``spans``."""
    model = fake_model()
    with tempfile.TemporaryDirectory(prefix="pg-trace-") as folder:
        engine = Engine(model, tracer=spans)
        await engine.start()
        server = await serve(f"unix:{folder}/w.sock", engine, model.info)
        client = await WorkerClient.connect(f"unix:{folder}/w.sock")
        try:
            yield Router([WorkerPool(model.info, [client], front=Front(model.info, model.encoder))])
        finally:
            await client.close()
            server.close()
            await engine.stop()


async def post(url: str, body: dict, **headers) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/embeddings", json=body, headers=headers) as resp:
            return resp.status, await resp.json()


async def test_the_span_joins_the_callers_trace_with_its_attributes(traced, receiver):
    url, flush = await traced()
    header, trace_id, parent_id = traceparent()
    status, body = await post(url, {"input": ["hello world", "a b c"], "encoding_format": "base64"},
                              traceparent=header, tracestate="vendor=x", **{"X-Request-Id": "req-1"})
    assert status == 200
    await flush()
    (span,) = receiver.named(names.SPAN_NAME)
    assert (span.trace_id, span.parent_span_id, span.trace_state) == (trace_id, parent_id, "vendor=x")
    assert span.kind == SERVER and span.status == STATUS_UNSET and span.service_name == "poolgate"
    a = span.attributes
    assert a[names.ATTR_REQUEST_ID] == "req-1" and a[names.ATTR_RESPONSE_ID] == body["id"] == "embd-req-1"
    assert a[names.ATTR_PROMPT_TOKENS] == a[names.ATTR_INPUT_TOKENS] == body["usage"]["prompt_tokens"] == 9
    assert a[names.ATTR_OPERATION] == "embeddings" and a[names.ATTR_PROVIDER] == "poolgate"
    assert a[names.ATTR_MODEL] == a[names.ATTR_RESPONSE_MODEL] == body["model"] == "fake-model"
    assert a[names.ATTR_ENCODING_FORMATS] == ["base64"] and a[names.ATTR_DIMENSION_COUNT] == 8
    assert a[names.ATTR_HTTP_ROUTE] == "/v1/embeddings" and a[names.ATTR_HTTP_STATUS] == 200
    assert names.ATTR_ERROR_TYPE not in a and a[names.ATTR_LANE] == "live"
    queue, inference = a[names.ATTR_TIME_IN_QUEUE], a[names.ATTR_TIME_IN_INFERENCE]
    assert queue >= 0 and inference > 0 and a[names.ATTR_E2E] >= queue + inference
    assert span.end_ns - span.start_ns >= a[names.ATTR_E2E] * 1e9 * 0.9


async def test_the_span_says_a_bulk_requests_lane(traced, receiver):
    url, flush = await traced()
    assert (await post(url, {"input": "x"}, **{"X-Poolgate-Lane": "bulk"}))[0] == 200
    await flush()
    (span,) = receiver.named(names.SPAN_NAME)
    assert names.ATTR_LANE == "poolgate.lane" and span.attributes[names.ATTR_LANE] == "bulk"


async def test_without_traceparent_the_span_starts_a_trace(traced, receiver):
    url, flush = await traced()
    assert (await post(url, {"input": "x"}))[0] == 200
    await flush()
    (span,) = receiver.named(names.SPAN_NAME)
    assert span.parent_span_id == "" and len(span.trace_id) == 32


async def test_one_span_per_request_under_concurrency(traced, receiver):
    url, flush = await traced()
    ids = [f"c{i}" for i in range(20)]
    results = await asyncio.gather(*(post(url, {"input": [f"text {i}"] * (i % 3 + 1)}, **{"X-Request-Id": rid})
                                     for i, rid in enumerate(ids)))
    assert all(status == 200 for status, _ in results)
    await flush()
    spans = receiver.named(names.SPAN_NAME)
    assert len(spans) == 20 and len({s.span_id for s in spans}) == 20
    by_id = {s.attributes[names.ATTR_REQUEST_ID]: s for s in spans}
    assert sorted(by_id) == sorted(ids)
    for rid, (_, body) in zip(ids, results):
        assert by_id[rid].attributes[names.ATTR_PROMPT_TOKENS] == body["usage"]["prompt_tokens"]


@pytest.mark.parametrize("body, status, error_type, routed", [
    ({"input": LONG}, 400, "context_length_exceeded", True),
    ({"input": "x", "model": "nope"}, 404, "model_not_found", False),
    ({"input": []}, 400, "invalid_request", True),  # the model resolved; the check failed after
])
async def test_a_4xx_has_error_type_and_leaves_the_status_unset(traced, receiver, body, status, error_type, routed):
    url, flush = await traced()
    got, err = await post(url, body)
    assert got == status and err["error"]["code"] == error_type
    await flush()
    (span,) = receiver.named(names.SPAN_NAME)
    a = span.attributes
    assert a[names.ATTR_ERROR_TYPE] == error_type and a[names.ATTR_HTTP_STATUS] == status
    assert span.status == STATUS_UNSET and names.ATTR_RESPONSE_MODEL not in a and names.ATTR_RESPONSE_ID not in a
    # the operation is known once the body is read (the route's task); the model only once it resolved
    assert a[names.ATTR_OPERATION] == "embeddings" and (names.ATTR_MODEL in a) == routed


async def test_a_5xx_sets_the_span_status_to_error(traced, receiver):
    url, flush = await traced()
    status, err = await post(url, {"input": [[CLS, FAIL_TOKEN]]})
    assert status == 500
    await flush()
    (span,) = receiver.named(names.SPAN_NAME)
    assert span.status == STATUS_ERROR and span.attributes[names.ATTR_ERROR_TYPE] == err["error"]["code"]


async def test_ops_routes_get_no_span(traced, receiver):
    url, flush = await traced()
    async with aiohttp.ClientSession() as session:
        for path in ("/health", "/ping", "/v1/models", "/version"):  # (/metrics is not served here: no recorder)
            async with session.get(f"{url}{path}") as resp:
                await resp.read()
    assert (await post(url, {"input": "x"}))[0] == 200
    await flush()
    assert [s.attributes[names.ATTR_HTTP_ROUTE] for s in receiver.spans] == ["/v1/embeddings"]


async def test_grpc_export(traced, receiver):
    url, flush = await traced(protocol="grpc")
    header, trace_id, _ = traceparent()
    assert (await post(url, {"input": "x"}, traceparent=header))[0] == 200
    await flush()
    (span,) = receiver.named(names.SPAN_NAME)
    assert span.trace_id == trace_id and span.attributes[names.ATTR_HTTP_STATUS] == 200


async def test_detailed_child_spans_join_the_request_span(traced, receiver):
    url, flush = await traced(detailed=True)
    header, trace_id, _ = traceparent()
    assert (await post(url, {"input": ["one two", "three"]}, traceparent=header))[0] == 200
    await flush()
    (parent,) = receiver.named(names.SPAN_NAME)
    children = sorted((s for s in receiver.spans if s.name in names.CHILD_SPANS), key=lambda s: s.start_ns)
    assert [s.name for s in children] == list(names.CHILD_SPANS)
    for child in children:
        assert (child.trace_id, child.parent_span_id, child.kind) == (trace_id, parent.span_id, INTERNAL)
        assert parent.start_ns - 1_000_000 <= child.start_ns <= child.end_ns <= parent.end_ns + 1_000_000
    # the gateway tokenizes, the call crosses to the worker, then one batch: queue, the runner's forward and pool,
    # in order, with no real gap
    tokenize, *worker = children
    assert 0 <= worker[0].start_ns - tokenize.end_ns < 100_000_000
    assert all(0 <= b.start_ns - a.end_ns < 1_000_000 for a, b in zip(worker, worker[1:]))


async def test_an_unsampled_caller_gets_no_spans_anywhere(traced, receiver):
    url, flush = await traced(detailed=True)
    header, _, _ = traceparent(sampled=False)
    assert (await post(url, {"input": "x"}, traceparent=header))[0] == 200
    await flush()
    assert receiver.spans == []
