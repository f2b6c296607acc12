"""shared.inputs.late_plan in a real engine (bundled MiniLM): one sequence per document, a vector per chunk."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.domain.late_chunks import LateChunkText
from poolgate.shared.domain.params import PoolingParams

from poolgate.workers.offline import PoolingModel


@pytest.fixture(scope="module")
def minilm():
    with PoolingModel(dtype="float32") as model:
        yield model


def test_a_call_of_many_documents_keeps_its_plan(minilm):
    docs = [f"document number {i} is about topic {i % 7} and more" for i in range(133)]
    result = minilm.submit([LateChunkText(d, None, 4) for d in docs], PoolingParams(task="embed"))
    assert result.windows is not None and len(result.windows.counts) == len(docs)
    assert len(result.outputs) == sum(result.windows.counts)
    np.testing.assert_allclose(np.linalg.norm(result.outputs.values, axis=1), 1.0, atol=1e-5)
    last = docs[-1]
    tokens = minilm.encode(last, pooling_task="token_embed", use_activation=False)[0]  # (T, 384) with CLS/SEP
    content = tokens[1:-1]
    want = [content[a:a + 4].mean(0) for a in range(0, len(content), 4)]
    got = result.outputs.values[-len(want):]
    for g, w in zip(got, want):
        assert float(g @ w / np.linalg.norm(w)) >= 0.99999
    assert result.prompt_tokens[-1] == len(tokens)  # each document counted once
