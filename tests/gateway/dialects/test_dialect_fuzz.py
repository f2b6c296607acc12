"""Odd bodies on the embedding routes never get a 500: every combination of a few odd values per field."""
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
}


def bodies(path: str, n: int, seed: int = 0):
    rng = random.Random(seed)
    fields = FIELDS[path]
    for _ in range(n):
        chosen = rng.sample(fields, rng.randint(1, 3))
        yield {f: rng.choice(ODD) for f in chosen}
    for a, b in itertools.combinations(ODD[:8], 2):  # a few pairs on the main field
        yield {fields[0]: [a, b]}


@pytest.mark.parametrize("path", list(FIELDS))
async def test_odd_bodies_are_4xx_or_200_never_5xx(gateway, path):
    client = await gateway(models=[fake_model(tasks=("embed", "token_embed"))])
    for body in bodies(path, 150):
        resp = await client.post(path, json=body)
        text = await resp.text()
        assert resp.status < 500, (body, text)
        if resp.status >= 400:
            assert ("message" in text), (body, text)
