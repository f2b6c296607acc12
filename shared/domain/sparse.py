"""Sparse embeddings (torch-free): which models have a sparse head, and the rows a sparse call answers.

A call with ``PoolingParams.sparse`` asks the worker for each input's sparse
vector: ``{token id: weight}`` with only positive weights, ids ascending.
Two heads give one (``SPARSE_HEADS``, by the served architecture):

- SPLADE (``BertSpladeSparseEmbeddingModel``): its ``embed`` output is already
  a vocabulary-size vector; the sparse vector is its non-zero entries;
- BGE-M3 (``BgeM3EmbeddingModel``): its ``token_classify`` output is one
  weight per token (BOS and EOS left out); the sparse vector keeps each token
  id's highest weight, leaving out the tokenizer's unused ids (CLS, EOS, PAD,
  UNK), as FlagEmbedding's ``_process_token_weights`` does.

A sparse call's ``Rows`` are ragged: input i owns rows
``offsets[i]:offsets[i + 1]``, each row ``(token id, weight)`` as float64
(ids and fp32 weights are exact in it), so any dialect reads them with
``item`` (OpenAI and Cohere here, TEI's ``/embed_sparse``). With
``return_tokens`` the worker also sends each id's token string
(``PoolingResult.tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.tasks import PoolingTask
from poolgate.shared.wire.messages import ModelInfo
from poolgate.shared.wire.rows import Rows


@dataclass(frozen=True)
class SparseHead:
    """Where a model's sparse weights come from: the task whose output holds them, per token or not."""

    task: PoolingTask
    per_token: bool  # one weight per token (BGE-M3), else one vocabulary-size vector per input (SPLADE)
    skip_first: int = 0  # tokens the task's rows leave out at the start and end of each sequence
    skip_last: int = 0


SPARSE_HEADS: dict[str, SparseHead] = {
    "BertSpladeSparseEmbeddingModel": SparseHead("embed", per_token=False),
    "BgeM3EmbeddingModel": SparseHead("token_classify", per_token=True, skip_first=1, skip_last=1),
}


def sparse_head(info: ModelInfo) -> SparseHead:
    """The model's sparse head; 400 for a model without one."""
    head = SPARSE_HEADS.get(info.architecture)
    if head is None or head.task not in info.tasks:
        raise InvalidRequest(
            f"Model '{info.served_model_name}' has no sparse head (SPLADE or BGE-M3's sparse "
            f"weights): sparse embeddings are not available for {info.architecture}.",
            param="embedding_types",
        )
    return head


@dataclass(frozen=True)
class SparseVector:
    """One input's sparse vector: ids ascending, their weights, and (when asked) their token strings."""

    indices: np.ndarray  # (nnz,) int64
    values: np.ndarray  # (nnz,) float32
    tokens: list[str | None] | None = None

    def to_json(self) -> dict[str, Any]:
        """``{indices, values[, tokens]}`` for a numpy-aware JSON writer (orjson's ``OPT_SERIALIZE_NUMPY``):
        the arrays as int64 and float64, so the numbers are those of their Python lists."""
        body: dict[str, Any] = {
            "indices": np.ascontiguousarray(self.indices, dtype=np.int64),
            "values": np.ascontiguousarray(self.values, dtype=np.float64),
        }
        if self.tokens is not None:
            body["tokens"] = self.tokens
        return body


def sparse_rows(vectors: list[tuple[np.ndarray, np.ndarray]]) -> Rows:
    """Ragged rows of ``(id, weight)`` pairs from each input's (ids, weights)."""
    counts = [len(ids) for ids, _ in vectors]
    values = np.zeros((sum(counts), 2), dtype=np.float64)
    if values.size:
        values[:, 0] = np.concatenate([ids for ids, _ in vectors])
        values[:, 1] = np.concatenate([w for _, w in vectors])
    return Rows(values, np.cumsum([0, *counts]).astype(np.int64))


def sparse_vector(rows: Rows, i: int, tokens: list[list[str | None]] | None = None) -> SparseVector:
    """Input ``i``'s sparse vector from a sparse call's rows (and its token strings, when sent)."""
    pairs = rows.item(i)  # (nnz, 2)
    return SparseVector(
        pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.float32), None if tokens is None else tokens[i]
    )
