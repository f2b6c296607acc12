"""Detailed traces in the worker: the Engine with ``CallSpans``, exporting to an OTLP/HTTP receiver."""
from __future__ import annotations

import asyncio
import secrets

import pytest

from poolgate.shared.telemetry import names
from poolgate.shared.config.frozen import TracingConfig
from poolgate.shared.domain.errors import InternalError
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.engine import Engine
from poolgate.workers.engine.tracing import CallSpans
from tests.fakes import CLS, FAIL_TOKEN, fake_model
from tests.otlp_receiver import OtlpReceiver

US = 1_000  # ns; conversions to epoch ns round each edge once


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def call(*inputs, trace_id: str | None = None, parent_id: str | None = None) -> PoolingCall:
    context = {"traceparent": f"00-{trace_id}-{parent_id}-01"} if trace_id else {}
    return PoolingCall(request_id="r1", model="fake-model", inputs=list(inputs), trace_context=context)


@pytest.fixture
def receiver():
    with OtlpReceiver() as r:
        yield r


@pytest.fixture
async def traced(receiver):
    """(engine, model, flush): an Engine over the fake model (token budget 64) with a CallSpans tracer."""
    spans = CallSpans(TracingConfig(endpoint=receiver.url, detailed=True))
    model = fake_model(max_batch_tokens=64)
    engine = Engine(model, tracer=spans)
    await engine.start()

    async def flush() -> None:
        assert await asyncio.to_thread(spans.force_flush)

    yield engine, model, flush
    await engine.stop()
    spans.shutdown()


async def test_a_call_over_several_batches_gets_its_spans_from_the_engines_clock(traced, receiver):
    engine, model, flush = traced
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    model.runner.execute_delay = 0.01
    result = await engine.submit(call(words(30), words(30), words(30), trace_id=trace_id, parent_id=parent_id))
    batches = len(model.runner.execute_times)
    assert batches >= 2  # 96 tokens over a 64-token budget
    await flush()
    spans = receiver.spans
    assert sorted(s.name for s in spans) == sorted(["queue"] + ["forward", "pool"] * batches)  # tokenize: the gateway's
    for s in spans:
        assert (s.trace_id, s.parent_span_id) == (trace_id, parent_id)
        assert s.attributes == {names.ATTR_REQUEST_ID: "r1"} and s.service_name == "poolgate"

    def seconds(span) -> float:
        return (span.end_ns - span.start_ns) / 1e9

    by_name = {}
    for s in sorted(spans, key=lambda s: s.start_ns):
        by_name.setdefault(s.name, []).append(s)
    timings = result.timings
    assert abs(seconds(by_name["queue"][0]) - timings["queue_s"]) < 2 * US / 1e9
    for forward, (start, end) in zip(by_name["forward"], model.runner.execute_times):
        assert 0.01 <= seconds(forward) <= end - start + 2 * US / 1e9  # the runner's own forward reading
    for forward, pool in zip(by_name["forward"], by_name["pool"]):
        assert abs(pool.start_ns - forward.end_ns) <= US and seconds(pool) >= 0  # pooling follows the forward
    assert by_name["queue"][0].end_ns <= by_name["forward"][0].start_ns + US


async def test_a_call_without_trace_context_gets_no_spans(traced, receiver):
    engine, _, flush = traced
    await engine.submit(call("hello"))
    await flush()
    assert receiver.spans == []


async def test_a_failed_call_gets_no_spans(traced, receiver):
    engine, _, flush = traced
    with pytest.raises(InternalError):
        await engine.submit(call([CLS, FAIL_TOKEN], trace_id=secrets.token_hex(16), parent_id=secrets.token_hex(8)))
    await flush()
    assert receiver.spans == []
