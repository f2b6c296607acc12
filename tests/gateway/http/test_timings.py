"""TEI's timing headers on every served answer (any dialect), measured from the request's record."""
from __future__ import annotations

import tempfile
from dataclasses import replace

from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.http.timings import timing_headers
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.gateway.telemetry.record import RequestRecord
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.inputs.front import Front
from poolgate.workers.load.hf_tokenizer import load_encoder
from tests.fakes import fake_model, worker_clients

NAMES = ("x-compute-type", "x-compute-time", "x-compute-characters", "x-compute-tokens", "x-total-time",
         "x-tokenization-time", "x-queue-time", "x-inference-time")


def test_headers_of_a_record_in_whole_milliseconds():
    record = RequestRecord("r", "/embed", 0, started=10.0, backend="cpu", prompt_tokens=7, characters=20,
                           tokenize_ns=(1_000_000, 3_900_000), queue_s=0.0049, inference_s=0.0121)
    assert timing_headers(record, now=10.2509) == {
        "x-compute-type": "cpu", "x-compute-time": "250", "x-compute-characters": "20", "x-compute-tokens": "7",
        "x-total-time": "250", "x-tokenization-time": "2", "x-queue-time": "4", "x-inference-time": "12"}
    assert timing_headers(RequestRecord("r", "/tokenize", 0, started=0.0)) == {}  # no model ran


async def test_served_answers_carry_them_and_errors_do_not():
    model = replace(fake_model(max_model_len=512), encoder=load_encoder(bundled_model_path()))
    with tempfile.TemporaryDirectory(prefix="pg-test-") as folder:
        async with worker_clients([model], folder) as clients:
            pool = WorkerPool(model.info, clients, front=Front(model.info, model.encoder))
            client = TestClient(TestServer(make_app(GatewayConfig(), Router([pool]))))
            await client.start_server()
            try:
                texts = ["a first text", "and a second, longer one"]
                openai = await client.post("/v1/embeddings", json={"input": texts})
                tokens = (await openai.json())["usage"]["prompt_tokens"]
                tei = await client.post("/embed", json={"inputs": texts})
                for resp in (openai, tei):
                    assert resp.status == 200
                    assert all(name in resp.headers for name in NAMES), dict(resp.headers)
                    assert resp.headers["x-compute-tokens"] == str(tokens)
                    assert resp.headers["x-compute-characters"] == str(sum(map(len, texts)))
                    assert resp.headers["x-compute-type"] == model.info.backend
                    assert int(resp.headers["x-total-time"]) >= int(resp.headers["x-inference-time"]) >= 0
                    assert resp.headers["x-compute-time"] == resp.headers["x-total-time"]
                bad = await client.post("/v1/embeddings", json={"input": texts, "dimensions": 3})
                tokenize = await client.post("/tokenize", json={"prompt": "a text"})
                assert bad.status == 400 and tokenize.status == 200
                assert not any(name in bad.headers or name in tokenize.headers for name in NAMES)
            finally:
                await client.close()
