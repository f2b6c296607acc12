"""Odd bodies on the embedding, score and rerank routes never get a 500: every combination of a few odd values
per field, and random content parts (images, audio, bad data URLs, wrong types) in every place that takes them."""
from __future__ import annotations

import itertools
import random

import pytest

from tests.fakes import fake_model

ODD = [None, "", "x", 0, -1, 1.5, True, [], [[]], [None], {}, {"role": "user"}, [{"role": "user", "content": 5}],
       [{"type": "text"}], "\ud800", [[{"role": "user", "content": "hi"}], []], ["a", [1]], 2**63]
FIELDS = {
    "/v1/embeddings": ["input", "messages", "encoding_format", "embed_dtype", "endianness", "dimensions",
                       "truncate_prompt_tokens", "truncation_side", "add_special_tokens", "chat_template_kwargs",
                       "add_generation_prompt"],
    "/v2/embed": ["texts", "inputs", "images", "input_type", "embedding_types", "truncate", "max_tokens",
                  "output_dimension"],
    "/pooling": ["input", "messages", "task", "encoding_format", "embed_dtype"],
    "/classify": ["input", "messages", "add_special_tokens"],
    "/score": ["queries", "documents", "max_tokens_per_doc", "instruction"],
    "/rerank": ["query", "documents", "top_n", "return_documents"],
}
URLS = ["data:image/png;base64,iVBORw0KGgo=", "data:image/png;base64,!!!", "data:,", "data:image/png,raw", "", "x",
        "iVBORw0KGgo=", "file:///etc/passwd", "http://127.0.0.1/a.png", "ftp://h/a", "data:" + "A" * 5000, 7, None,
        {"url": 5}, ["data:,"]]
PART_TYPES = ["text", "image_url", "input_audio", "audio_url", "video_url", "image_embeds", "prompt_embeds",
              "refusal", "", None, 3]


def random_part(rng: random.Random) -> object:
    """A content part: right, nearly right or wrong in any of its fields."""
    kind = rng.choice(PART_TYPES)
    url = rng.choice(URLS)
    part: dict = {} if kind is None else {"type": kind}
    shape = rng.randrange(6)
    if shape == 0:
        part["text"] = rng.choice(["a", "", 5, None, "\ud800"])
    elif shape == 1:
        part["image_url"] = {"url": url, "detail": rng.choice(["low", 3])} if rng.random() < 0.7 else url
    elif shape == 2:
        part["input_audio"] = rng.choice([{"data": rng.choice(["UklGRg==", "!", 5]), "format": rng.choice(
            ["wav", "flac", "WAV", "wav;base64,x", "", 9])}, "x", None])
    elif shape == 3:
        part["audio_url"] = {"url": url} if rng.random() < 0.5 else url
    elif shape == 4:
        part["uuid"] = rng.choice(["u", 1, None])
        part[rng.choice(["image_url", "audio_url", "video_url", "image_embeds"])] = url
    return part if rng.random() < 0.9 else rng.choice([None, "part", 1, []])


def media_body(path: str, rng: random.Random) -> dict:
    """A body whose content parts are random (``random_part``), in the place ``path`` takes them."""
    parts = [random_part(rng) for _ in range(rng.randint(0, 4))]
    content = {"content": parts}
    if path in ("/v1/embeddings", "/pooling", "/classify"):
        messages = [{"role": rng.choice(["user", "system", 5]), "content": parts}]
        return {rng.choice(["messages", "input"]): messages if rng.random() < 0.7 else [messages, messages]}
    if path == "/v2/embed":
        if rng.random() < 0.5:
            return {"inputs": [content], "input_type": rng.choice(["image", "search_query", "bogus", None])}
        return {"images": [rng.choice(URLS) for _ in range(rng.randint(0, 3))], "input_type": "image"}
    if path == "/score":
        return {"queries": rng.choice(["q", content, {"image": rng.choice(URLS)}]), "documents": [content, "d"]}
    return {"query": rng.choice(["q", content]), "documents": [content, {"image": rng.choice(URLS)}, {"text": "t"}]}


def bodies(path: str, n: int, seed: int = 0):
    rng = random.Random(seed)
    fields = FIELDS[path]
    for _ in range(n):
        chosen = rng.sample(fields, rng.randint(1, 3))
        yield {f: rng.choice(ODD) for f in chosen}
    for a, b in itertools.combinations(ODD[:8], 2):  # a few pairs on the main field
        yield {fields[0]: [a, b]}
    for _ in range(n):
        yield media_body(path, rng)


@pytest.mark.parametrize("path", list(FIELDS))
async def test_odd_bodies_are_4xx_or_200_never_5xx(gateway, path):
    tasks = ("classify",) if path in ("/classify",) else ("embed", "token_embed")
    client = await gateway(models=[fake_model(tasks=tasks, **({"num_labels": 1, "dim": 1} if tasks == ("classify",) else {}))])
    for body in bodies(path, 150):
        resp = await client.post(path, json=body)
        text = await resp.text()
        assert resp.status < 500, (body, text)
        if resp.status >= 400:
            assert ("message" in text), (body, text)
