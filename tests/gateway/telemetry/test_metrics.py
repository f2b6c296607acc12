"""GET /metrics over real workers (fake model): request series, worker series pulled over the transport."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from poolgate.gateway.telemetry.metrics import worker_label
from poolgate.gateway.http.state import ROUTER
from poolgate.shared.telemetry import names
from poolgate.shared.domain.errors import Overloaded
from tests.fakes import RefusingRunner, fake_model
from tests.gateway.telemetry.scrape import EMBED, samples, total, value

LONG = " ".join(["word"] * 40)  # 42 tokens > the fake's 32


async def test_request_series(scraped):
    client = await scraped()
    tokens = 0
    for text in ("hello world", "a b c", "x"):
        body = await (await client.post(EMBED, json={"input": [text, text]})).json()
        tokens += body["usage"]["prompt_tokens"]
    assert (await client.post(EMBED, json={"input": LONG})).status == 400
    assert (await client.post(EMBED, json={"model": "nope", "input": "x"})).status == 404
    assert (await client.get("/no/such/path")).status == 404
    assert (await client.get("/health")).status == 200
    got = await samples(client)
    m = "fake-model"
    assert value(got, f"{names.REQUESTS}_total", route=EMBED, model=m, status="200") == 3
    assert value(got, f"{names.REQUESTS}_total", route=EMBED, model=m, status="400") == 1
    assert value(got, f"{names.REQUESTS}_total", route=EMBED, model="none", status="404") == 1
    assert value(got, f"{names.REQUESTS}_total", route="unmatched", model="none", status="404") == 1
    assert total(got, f"{names.REQUESTS}_total") == 6  # /health and /metrics are not counted
    assert value(got, f"{names.REQUEST_ERRORS}_total", route=EMBED, model=m,
                 error_type="context_length_exceeded") == 1
    assert value(got, f"{names.REQUEST_ERRORS}_total", route=EMBED, model="none", error_type="model_not_found") == 1
    assert value(got, f"{names.PROMPT_TOKENS}_total", model=m, task="embed") == tokens
    assert value(got, f"{names.REQUEST_PROMPT_TOKENS}_sum", model=m, task="embed") == tokens
    assert value(got, f"{names.REQUEST_DURATION}_count", route=EMBED, model=m) == 4
    assert value(got, f"{names.REQUEST_DURATION}_bucket", route=EMBED, model=m, le="0.001") <= 4
    for name in (names.QUEUE_TIME, names.INFERENCE_TIME):
        assert value(got, f"{name}_count", model=m, task="embed", backend="cpu") == 3
    assert value(got, names.REQUESTS_IN_FLIGHT, model=m) == 0


async def test_worker_series_come_from_the_worker(scraped):
    client = await scraped()
    for _ in range(3):
        assert (await client.post(EMBED, json={"input": ["a b", "c d e"]})).status == 200
    got = await samples(client)
    pool = client.app[ROUTER].pools["fake-model"]
    labels = {"model": "fake-model", "backend": "cpu", "worker": worker_label(pool.clients[0].address)}
    assert labels["worker"] == "w0.sock"
    assert value(got, names.WORKER_UP, **labels) == 1
    assert value(got, f"{names.WORKER_RECOVERIES}_total", **labels) == 0
    assert value(got, names.SEQUENCES_WAITING, **labels) == 0
    assert value(got, names.SEQUENCES_RUNNING, **labels) == 0
    assert value(got, f"{names.BATCH_SIZE}_sum", **labels) == 6  # every sequence in some batch
    assert value(got, f"{names.BATCH_TOKENS}_sum", **labels) == 3 * (4 + 5)
    batches = value(got, f"{names.BATCH_SIZE}_count", **labels)
    assert 1 <= batches <= 3 and value(got, f"{names.BATCH_FILL}_count", **labels) == batches
    assert value(got, f"{names.BATCH_SIZE}_bucket", **labels, le="+Inf") == batches
    assert not any(n == names.DEVICE_MEMORY for n, _ in got)  # the CPU reports no device memory


async def test_device_memory_where_the_backend_reports_it(scraped):
    model = dataclasses.replace(fake_model(), device_memory=lambda: {"allocated": 1234, "reserved": 4096})
    client = await scraped(models=[model])
    got = await samples(client)
    assert value(got, names.DEVICE_MEMORY, model="fake-model", backend="cpu", worker="w0.sock", kind="reserved") == 4096


async def test_a_workers_429_is_counted_under_its_own_reason(scraped):
    client = await scraped(models=[fake_model(runner=RefusingRunner(Overloaded("full", reason="queue_full")))])
    assert (await client.post(EMBED, json={"input": "x"})).status == 429
    got = await samples(client)
    assert value(got, f"{names.ADMISSION_REJECTIONS}_total", model="fake-model", reason="queue_full") == 1


async def test_a_worker_that_does_not_answer_is_down(scraped):
    client = await scraped()
    pool = client.app[ROUTER].pools["fake-model"]
    await pool.clients[0].close()
    got = await samples(client)
    assert value(got, names.WORKER_UP, model="fake-model", backend="cpu", worker="w0.sock") == 0
    assert total(got, names.SEQUENCES_WAITING) == 0 and (names.SEQUENCES_WAITING, frozenset()) not in got


async def test_admission_rejections_and_in_flight(scraped):
    model = fake_model()
    model.runner.release.clear()  # hold the first batch on the "device"
    client = await scraped(models=[model], max_in_flight=1)
    held = asyncio.create_task(client.post(EMBED, json={"input": "x"}))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    assert (await client.post(EMBED, json={"input": "y"})).status == 429
    got = await samples(client)
    assert value(got, names.REQUESTS_IN_FLIGHT, model="fake-model") == 1
    assert value(got, names.SEQUENCES_RUNNING, model="fake-model", backend="cpu", worker="w0.sock") == 1
    assert value(got, names.REQUESTS_RUNNING, model="fake-model", backend="cpu", worker="w0.sock") == 1
    assert value(got, names.REQUESTS_WAITING, model="fake-model", backend="cpu", worker="w0.sock") == 0
    assert value(got, f"{names.ADMISSION_REJECTIONS}_total", model="fake-model", reason="workers_busy") == 1
    model.runner.release.set()
    assert (await held).status == 200


async def test_no_metrics_when_off(gateway):
    client = await gateway()
    assert (await client.get("/metrics")).status == 404


async def test_a_client_that_leaves_is_counted_as_499(scraped):
    model = fake_model()
    model.runner.release.clear()
    client = await scraped(models=[model])
    leaving = asyncio.create_task(client.post(EMBED, json={"input": "x"}))
    await asyncio.to_thread(model.runner.entered.wait, 2)
    leaving.cancel()  # drops the connection; aiohttp cancels the handler
    with pytest.raises(asyncio.CancelledError):
        await leaving
    model.runner.release.set()
    for _ in range(100):
        got = await samples(client)
        if total(got, f"{names.REQUESTS}_total", status="499"):
            break
        await asyncio.sleep(0.02)
    assert value(got, f"{names.REQUESTS}_total", route=EMBED, model="fake-model", status="499") == 1
    assert value(got, f"{names.REQUEST_ERRORS}_total", route=EMBED, model="fake-model",
                 error_type="client_closed_request") == 1


async def test_a_client_that_leaves_while_the_body_is_written_is_counted(scraped):
    """The handler finished; writing its body is cancelled (the client left): still recorded, as 499."""
    from aiohttp import web

    class CancelledWhileWriting(web.Response):
        async def write_eof(self, data=b""):
            raise asyncio.CancelledError()

    async def big(request):
        return CancelledWhileWriting(text="x" * 1000)

    client = await scraped(routes=[("/v1/big", big)])
    with contextlib.suppress(Exception):
        await client.get("/v1/big")
    got = await samples(client)
    assert value(got, f"{names.REQUESTS}_total", route="/v1/big", model="none", status="499") == 1


async def test_embedding_cache_hits_and_misses_come_from_the_worker(scraped):
    client = await scraped(models=[dataclasses.replace(fake_model(), cache_bytes=1 << 20)])
    for _ in range(3):
        assert (await client.post(EMBED, json={"input": ["a b", "c d e"]})).status == 200
    got = await samples(client)
    labels = {"model": "fake-model", "backend": "cpu", "worker": "w0.sock"}
    assert value(got, f"{names.EMBEDDING_CACHE_MISSES}_total", **labels) == 2
    assert value(got, f"{names.EMBEDDING_CACHE_HITS}_total", **labels) == 4
    assert value(got, names.EMBEDDING_CACHE_BYTES, **labels) > 0


async def test_a_model_without_the_cache_has_no_cache_series(scraped):
    client = await scraped()
    assert (await client.post(EMBED, json={"input": ["a b"]})).status == 200
    got = await samples(client)
    assert not any(n.startswith(("poolgate_embedding_cache", "poolgate_prefix_cache")) for n, _ in got)


class _PrefixStats:
    def stats(self) -> dict[str, int]:
        return {"looked_up_tokens": 100, "hit_tokens": 60, "shared_tokens": 20, "blocks": 4, "bytes": 4096}


async def test_the_prefix_cache_figures_come_from_the_worker(scraped):
    model = fake_model()
    model.runner.prefix_cache = _PrefixStats()  # a causal decoder's runner carries one (workers.engine.prefix_cache)
    client = await scraped(models=[model])
    assert (await client.post(EMBED, json={"input": ["a b"]})).status == 200
    got = await samples(client)
    labels = {"model": "fake-model", "backend": "cpu", "worker": "w0.sock"}
    assert value(got, f"{names.PREFIX_CACHE_LOOKED_UP}_total", **labels) == 100
    assert value(got, f"{names.PREFIX_CACHE_HITS}_total", **labels) == 60
    assert value(got, f"{names.PREFIX_CACHE_SHARED}_total", **labels) == 20
    assert value(got, names.PREFIX_CACHE_BYTES, **labels) == 4096


async def test_a_workers_capacity_and_out_of_memory_splits_are_series(scraped):
    pytest.importorskip("torch")
    from tests.fakes import OutOfMemoryRunner

    client = await scraped(models=[fake_model(runner=OutOfMemoryRunner(max_tokens=4))])
    resp = await client.post(EMBED, json={"input": [[1, 2, 3], [4, 5, 6]]})  # 6 tokens: run in halves
    assert resp.status == 200
    got = await samples(client)
    labels = {"model": "fake-model", "backend": "cpu", "worker": "w0.sock"}
    assert value(got, f"{names.DEVICE_OUT_OF_MEMORY}_total", **labels) == 1
    assert value(got, names.WORKER_TOKENS_PER_S, **labels) > 0
