"""Detailed traces in the worker: the Engine with ``CallSpans``, exporting to an OTLP/HTTP receiver."""
from __future__ import annotations

import asyncio
import secrets

import pytest

from poolgate.shared import telemetry as names
from poolgate.shared.config import TracingConfig
from poolgate.shared.errors import InternalError
from poolgate.shared.wire import PoolingCall
from poolgate.workers.engine import Engine
from poolgate.workers.tracing import CallSpans
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


async def test_a_call_over_several_batches_gets_four_spans_from_the_engines_clock(traced, receiver):
    engine, model, flush = traced
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    result = await engine.submit(call(words(30), words(30), words(30), trace_id=trace_id, parent_id=parent_id))
    assert len(model.runner.execute_times) >= 2  # 96 tokens over a 64-token budget
    await flush()
    spans = {s.name: s for s in receiver.spans}
    assert sorted(spans) == sorted(names.CHILD_SPANS)
    for s in spans.values():
        assert (s.trace_id, s.parent_span_id) == (trace_id, parent_id)
        assert s.attributes == {names.ATTR_REQUEST_ID: "r1"} and s.service_name == "poolgate"

    def seconds(name: str) -> float:
        return (spans[name].end_ns - spans[name].start_ns) / 1e9

    timings = result.timings
    assert abs(seconds("tokenize") - timings["tokenize_s"]) < 2 * US / 1e9
    assert abs(seconds("queue") - timings["queue_s"]) < 2 * US / 1e9
    assert abs(seconds("forward") - timings["inference_s"]) < 2 * US / 1e9
    (first, _), (_, last) = model.runner.execute_times[0], model.runner.execute_times[-1]
    assert seconds("forward") >= last - first  # from the first batch's execute to the last one's end
    assert seconds("pool") >= 0


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
