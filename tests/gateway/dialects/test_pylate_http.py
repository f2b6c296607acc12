"""A PyLate ColBERT folder through HTTP against PyLate itself: /pooling and /v1/embeddings by input_type, /score, /rerank.

The reference and the folder come from PyLate in its own venv
(``tests.workers.pooling.test_pylate``); poolgate serves that folder with a real
worker. Queries and documents say their role with ``input_type``; the score
routes know which side is the query.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.workers.load.test_whole_load import _load
from tests.workers.pooling.test_pylate import DOCUMENTS, QUERIES, SETTINGS, VENV_PYTHON, _reference, venv  # noqa: F401


@pytest.fixture(scope="module")
def pylate(tmp_path_factory):
    if not VENV_PYTHON.exists():
        return None
    return _reference(tmp_path_factory.mktemp("pylate"), SETTINGS["expansion, not attended"])


async def post(client, path, body, status=200) -> dict:
    resp = await client.post(path, json=body)
    assert resp.status == status, await resp.text()
    return await resp.json()


async def test_token_vectors_by_input_type_equal_pylates(gateway, venv, pylate):
    folder, want_q, want_d, _ = pylate
    client = await gateway(models=[_load(folder)])
    queries = await post(client, "/pooling", {"input": QUERIES, "input_type": "query"})
    documents = await post(client, "/pooling", {"input": DOCUMENTS, "input_type": "search_document"})
    for item, want in zip(queries["data"] + documents["data"], want_q + want_d):
        np.testing.assert_allclose(np.array(item["data"]), want, atol=2e-5)
    embedded = await post(client, "/v1/embeddings", {"input": DOCUMENTS[:2], "input_type": "passage"})
    for item, want in zip(embedded["data"], want_d):
        np.testing.assert_allclose(np.array(item["embedding"]), want, atol=2e-5)


async def test_score_and_rerank_equal_pylates_maxsim(gateway, venv, pylate):
    folder, _, _, want = pylate
    client = await gateway(models=[_load(folder)])
    scored = await post(client, "/score", {"queries": QUERIES[0], "documents": DOCUMENTS})
    np.testing.assert_allclose([d["score"] for d in scored["data"]], want[0], atol=1e-4)
    reranked = await post(client, "/rerank", {"query": QUERIES[1], "documents": DOCUMENTS})
    order = np.argsort(-want[1], kind="stable")
    assert [r["index"] for r in reranked["results"]] == order.tolist()
    np.testing.assert_allclose([r["relevance_score"] for r in reranked["results"]], want[1][order], atol=1e-4)


async def test_a_request_without_a_role_is_a_400(gateway, venv, pylate):
    client = await gateway(models=[_load(pylate[0])])
    body = await post(client, "/pooling", {"input": QUERIES}, status=400)
    assert "say which the inputs are with input_type (search_query, query, search_document" in str(body)
    body = await post(client, "/v1/embeddings", {"input": QUERIES, "input_type": "clustering"}, status=400)
    assert "Unsupported input_type 'clustering'" in str(body)
