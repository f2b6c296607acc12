"""Pair scores from pooled outputs (torch-free): vLLM's 1:1 / 1:N / N:N pairing, cosine and MaxSim.

A score request pairs ``queries`` with ``documents``: one query with every
document (1:N), or query i with document i (1:1, N:N). A bi-encoder
(``embed``) and a late-interaction model (``token_embed``) pool each query and
each document ONCE, in one call, queries first; the scores are then computed
here from that call's ``Rows``, in float32: the cosine of the two vectors
(each norm clamped at 1e-8, as torch's ``cosine_similarity``), or MaxSim, the
sum over query tokens of the best dot product with any document token.
A cross-encoder (``classify``) pools each pair as one sequence instead, so
its scores are its outputs as they come.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.wire.rows import Rows

EPS = 1e-8


def check_pairs(n_queries: int, n_documents: int) -> None:
    """vLLM's pairing rules and messages: 1:1, 1:N or N:N, neither side empty."""
    if n_queries > 1 and n_queries != n_documents:
        raise InvalidRequest("Input lengths must be either 1:1, 1:N or N:N", param="queries")
    if n_queries == 0:
        raise InvalidRequest("At least one text element must be given", param="queries")
    if n_documents == 0:
        raise InvalidRequest("At least one text_pair element must be given", param="documents")


def query_of(n_queries: int, n_documents: int) -> list[int]:
    """The query index each document is paired with."""
    return [0] * n_documents if n_queries == 1 else list(range(n_documents))


def cosine_scores(rows: Rows, n_queries: int, index: list[int] | None = None) -> np.ndarray:
    """(pairs,) cosines: ``rows`` holds the queries' then the documents' vectors, (n, dim); ``index``: the
    query of each document row (default: vLLM's pairing)."""
    vectors = rows.values.astype(np.float32, copy=False)
    queries, documents = vectors[:n_queries], vectors[n_queries:]  # (q, dim), (d, dim)
    norms_q = np.maximum(np.linalg.norm(queries, axis=1), EPS)  # (q,)
    norms_d = np.maximum(np.linalg.norm(documents, axis=1), EPS)  # (d,)
    of = np.asarray(query_of(n_queries, len(documents)) if index is None else index, dtype=np.int64)  # (d,)
    dots = np.einsum("ij,ij->i", queries[of], documents)  # (d,)
    return (dots / (norms_q[of] * norms_d)).astype(np.float32)


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """Σ over query tokens of the max over document tokens of q·d, in float32."""
    sims = query.astype(np.float32) @ document.astype(np.float32).T  # (query tokens, document tokens)
    return float(sims.max(axis=1).sum())


def maxsim_scores(rows: Rows, n_queries: int, index: list[int] | None = None) -> np.ndarray:
    """(pairs,) MaxSim scores: ``rows`` holds the queries' then the documents' token vectors."""
    n_documents = len(rows) - n_queries
    index = query_of(n_queries, n_documents) if index is None else index
    return np.array(
        [maxsim(rows.item(index[i]), rows.item(n_queries + i)) for i in range(n_documents)], dtype=np.float32
    )


def cross_encoder_scores(rows: Rows, n_queries: int, index: list[int] | None = None) -> np.ndarray:
    """(pairs,) scores of a one-label classifier: one row per pair, its single output."""
    return rows.values.reshape(len(rows), -1)[:, 0].astype(np.float32)


# How each task's outputs become pair scores (by shared.domain.tasks.SCORE_TYPES name).
SCORERS: dict[str, Callable[[Rows, int, list[int] | None], np.ndarray]] = {
    "bi-encoder": cosine_scores,
    "late-interaction": maxsim_scores,
    "cross-encoder": cross_encoder_scores,
}
