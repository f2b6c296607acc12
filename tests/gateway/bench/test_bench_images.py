"""``poolgate bench --images``: one image per request in vLLM's chat form, against a fake server that reads them."""
from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json

import numpy as np
from aiohttp import web
from PIL import Image

from poolgate.gateway.bench.cli import add_arguments, main


class FakeImageServer:
    """Answers /v1/models and /v1/embeddings bodies of one user turn with one image_url part (a PNG data: URL)."""

    def __init__(self) -> None:
        self.sizes: list[tuple[int, int]] = []
        self.digests: set[bytes] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/embeddings", self.embeddings)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "clip", "object": "model"}]})

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        (turn,) = body["messages"]
        (part,) = turn["content"]
        assert turn["role"] == "user" and part["type"] == "image_url" and "input" not in body
        head, data = part["image_url"]["url"].split(",", 1)
        assert head == "data:image/png;base64"
        raw = base64.b64decode(data)
        image = Image.open(io.BytesIO(raw))
        self.sizes.append(image.size)
        self.digests.add(raw)
        tokens = (image.size[0] // 32) ** 2 + 1  # a ViT-B/32's patches and class token
        vec = np.ones(4, "<f4")
        emb = base64.b64encode(vec.tobytes()).decode() if body["encoding_format"] == "base64" else vec.tolist()
        return web.json_response({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": emb}],
                                  "model": body["model"], "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


async def test_images_mode_sends_each_image_and_counts_images_and_tokens(capsys):
    fake = FakeImageServer()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        args = parse("--url", url, "--images", "12", "--image-size", "64", "--concurrency", "3", "--warmup", "0")
        assert await asyncio.to_thread(main, args) == 0
    finally:
        await runner.cleanup()
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads(lines[-1])
    assert report["mode"] == "images" and report["image_size"] == 64 and report["model"] == "clip"
    assert report["inputs"] == report["requests"] == 12 and report["errors"] == 0
    assert report["prompt_tokens"] == 12 * 5 and report["images_per_s"] == report["inputs_per_s"] > 0
    assert fake.sizes == [(64, 64)] * 12 and len(fake.digests) == 12  # every image differs: no cache answers
    assert any("images/s" in line for line in lines)
