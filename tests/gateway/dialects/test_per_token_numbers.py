"""The embeddings extension's per-token floats (multi_vector, sparse weights) go from numpy to JSON with the
numbers their Python lists gave (``dialects.encoding.to_double_list``, ``SparseVector.to_json``)."""
from __future__ import annotations

import numpy as np
import orjson

from poolgate.gateway.dialects import encoding
from poolgate.shared.domain.sparse import SparseVector
from tests.fakes import fake_model


def per_token_values() -> np.ndarray:
    """(T, dim) float32 values whose float32 and float64 renderings differ, and the edge cases."""
    values = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
    values[0, :6] = [0.1, 1e-8, 1 / 3, -0.0, 1e-45, 3.4e38]
    return values


def test_multi_vector_numbers_are_those_of_its_python_lists():
    rows = per_token_values()
    for block in (rows, rows[:, ::2], rows[:0]):  # a whole block, a strided view, no tokens
        written = encoding.to_double_list(block)
        assert isinstance(written, np.ndarray)  # no Python float per element
        assert encoding.dumps({"multi_vector": written}) == orjson.dumps({"multi_vector": block.tolist()})


def test_sparse_numbers_are_those_of_its_python_lists():
    values = per_token_values()[0]
    vector = SparseVector(np.arange(7, dtype=np.int64) * 1000, values, tokens=list("abcdefg"))
    body = vector.to_json()
    assert isinstance(body["values"], np.ndarray)
    assert encoding.dumps(body) == orjson.dumps(
        {"indices": vector.indices.tolist(), "values": values.tolist(), "tokens": list("abcdefg")})


async def test_multi_vector_over_http_is_the_token_vectors_as_python_floats(gateway):
    client = await gateway(models=[fake_model(tasks=("embed", "token_embed"))])
    body = {"input": ["a b c"], "embedding_types": ["multi_vector"]}
    multi = (await (await client.post("/v1/embeddings", json=body)).json())["data"][0]["multi_vector"]
    pooled = await (await client.post("/pooling", json={"input": ["a b c"], "task": "token_embed"})).json()
    # /pooling writes the same float32 rows as float32; multi_vector writes each as the float64 it widens to
    expected = np.asarray(pooled["data"][0]["data"], dtype=np.float32).tolist()
    assert orjson.dumps(multi) == orjson.dumps(expected) and len(multi) > 1
