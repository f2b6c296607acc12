"""The bench load loop and ``main()`` against a small fake embeddings server."""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import socket

import numpy as np
import pytest
from aiohttp import web

from poolgate.gateway.bench.cli import add_arguments, main
from poolgate.shared.domain.corpus import synthetic_corpus
from poolgate.gateway.bench.load import LoadConfig, first_model_id, run_load

DIM = 8


class FakeEmbeddingServer:
    """Answers /v1/models and /v1/embeddings; every ``fail_every``-th request gets a 500."""

    def __init__(self, *, fail_every: int = 0, api_key: str | None = None, short: bool = False):
        self.fail_every, self.api_key, self.short = fail_every, api_key, short
        self.requests = self.inputs = self.tokens = 0
        self.formats: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/embeddings", self.embeddings)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def embeddings(self, request: web.Request) -> web.Response:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        body = await request.json()
        self.requests += 1
        if self.fail_every and self.requests % self.fail_every == 0:
            return web.json_response({"error": {"message": "injected"}}, status=500)
        texts = body["input"]
        fmt = body.get("encoding_format", "float")
        self.formats.add(fmt)
        tokens = sum(len(t.split()) + 2 for t in texts)
        self.inputs += len(texts)
        self.tokens += tokens
        data = []
        for i, _ in enumerate(texts[: len(texts) - 1] if self.short else texts):
            vec = np.full(DIM, i, dtype="<f4")
            emb = base64.b64encode(vec.tobytes()).decode() if fmt == "base64" else vec.tolist()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return web.json_response({"object": "list", "data": data, "model": body["model"], "usage": usage})


async def start(fake: FakeEmbeddingServer):
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def serve():
    runners = []

    async def _serve(**kwargs):
        fake = FakeEmbeddingServer(**kwargs)
        runner, url = await start(fake)
        runners.append(runner)
        return fake, url

    yield _serve
    for runner in runners:
        await runner.cleanup()


TEXTS = synthetic_corpus(100, seed=1)
TOKENS = sum(len(t.split()) + 2 for t in TEXTS)


async def test_counts_requests_inputs_and_tokens(serve):
    fake, url = await serve()
    cfg = LoadConfig(url=url, model="fake-model", batch_size=8, concurrency=4, warmup=2)
    result = await run_load(cfg, TEXTS)
    assert result.requests == result.ok_requests == math.ceil(100 / 8) == 13
    assert fake.requests == 13 + 2                      # warm-up is sent but not counted
    assert result.inputs == 100 and result.prompt_tokens == TOKENS
    assert len(result.latencies_s) == 13 and all(x > 0 for x in result.latencies_s)
    assert result.error_count == 0 and result.embedding_dim == DIM
    assert 0 < max(result.latencies_s) <= result.wall_s
    assert fake.formats == {"base64"}


async def test_injected_500s_are_errors(serve):
    fake, url = await serve(fail_every=3)
    cfg = LoadConfig(url=url, model="fake-model", batch_size=8, concurrency=3, warmup=0)
    result = await run_load(cfg, TEXTS)
    assert result.requests == 13
    assert result.errors == {"HTTP 500": 4} and result.ok_requests == 9
    assert result.inputs == fake.inputs and result.prompt_tokens == fake.tokens
    assert len(result.latencies_s) == 9
    assert "injected" in result.error_samples[0]


async def test_passes_float_format_and_api_key(serve):
    fake, url = await serve(api_key="sekret")
    cfg = LoadConfig(url=url, model="fake-model", api_key="sekret", batch_size=32, concurrency=2,
                     encoding_format="float", passes=2, warmup=0)
    result = await run_load(cfg, TEXTS)
    assert result.requests == 8 and result.inputs == 200 and result.prompt_tokens == 2 * TOKENS
    assert result.error_count == 0 and fake.formats == {"float"}
    bad = await run_load(LoadConfig(url=url, model="fake-model", warmup=0), TEXTS)
    assert bad.errors == {"HTTP 401": 4}


async def test_wrong_number_of_embeddings_is_a_bad_response(serve):
    _, url = await serve(short=True)
    result = await run_load(LoadConfig(url=url, model="fake-model", warmup=0), TEXTS[:40])
    assert result.errors == {"bad response": 2} and result.inputs == 0


async def test_duration_mode_cycles_the_corpus(serve):
    _, url = await serve()
    cfg = LoadConfig(url=url, model="fake-model", batch_size=50, concurrency=2, warmup=0,
                     duration_s=0.3)
    result = await run_load(cfg, TEXTS)
    assert result.requests > 2 and result.error_count == 0   # more than one pass of 2 batches
    assert result.wall_s >= 0.3


async def test_model_defaults_to_first_listed(serve):
    _, url = await serve()
    assert await first_model_id(url) == "fake-model"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_main_prints_table_and_json(serve, capsys, tmp_path):
    fake, url = await serve()
    out_path = tmp_path / "r.json"
    args = parse("--url", url, "--num-texts", "64", "--batch-size", "16", "--concurrency", "2",
                 "--json", str(out_path))
    assert await asyncio.to_thread(main, args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads(lines[-1])
    assert report["model"] == "fake-model" and report["requests"] == 4
    assert report["inputs"] == 64 and report["errors"] == 0
    assert report["prompt_tokens"] == sum(len(t.split()) + 2 for t in synthetic_corpus(64, 0))
    assert report["tokens_per_s"] > 0 and report["latency_ms"]["p99"] > 0
    assert any(line.strip().startswith("tokens/s") for line in lines)
    assert json.loads(out_path.read_text()) == report


async def test_main_exit_codes(serve, capsys):
    _, url = await serve(fail_every=2)
    args = parse("--url", url, "--model", "fake-model", "--num-texts", "64", "--warmup", "0")
    assert await asyncio.to_thread(main, args) == 1
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["errors"] == 1
    with socket.socket() as sock:                     # a port where nothing listens
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert await asyncio.to_thread(main, parse("--url", dead, "--num-texts", "8")) == 2
