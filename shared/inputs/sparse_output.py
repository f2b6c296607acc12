"""A sparse call's answer, made where the tokenizer is: each input's ``{token id: weight}`` from its rows.

The rows are the worker's (``shared.domain.sparse``), the token strings the
tokenizer's, so the gateway (``shared.inputs.front``) makes the answer.

The engine runs a sparse call through the model's sparse head's task like any
other call, then ``SparseOutput`` turns its rows into sparse rows: SPLADE's
vocabulary-size vector keeps its positive entries; BGE-M3's per-token
weights (the sequence's tokens less the ones its rows leave out) keep each
id's highest positive weight, without the tokenizer's unused ids (CLS, EOS,
PAD, UNK), as FlagEmbedding does. With ``return_tokens`` each id's token
string comes too.
"""

from __future__ import annotations

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.sparse import SPARSE_HEADS, SparseHead, sparse_rows
from poolgate.shared.inputs.encoded import TextEncoder
from poolgate.shared.wire.messages import ModelInfo
from poolgate.shared.wire.rows import Rows

UNUSED = ("cls_token", "eos_token", "sep_token", "pad_token", "unk_token")  # XLM-R: EOS is SEP


class SparseOutput:
    """Sparse rows for one model (its head by architecture, its tokenizer's unused ids)."""

    def __init__(self, info: ModelInfo, encoder: TextEncoder):
        self.head: SparseHead | None = SPARSE_HEADS.get(info.architecture)
        self.architecture = info.architecture
        self.encoder = encoder
        special = getattr(encoder, "special_token_id", None)  # a fake encoder may have none
        ids = {i for name in UNUSED if special is not None and (i := special(name)) is not None}
        self.unused = np.array(sorted(ids), dtype=np.int64)

    def __call__(
        self, rows: Rows, token_lists: list[list[int]], params: PoolingParams
    ) -> tuple[Rows, list[list[str | None]] | None]:
        """The sparse rows of a call (and each id's token string with ``return_tokens``)."""
        if self.head is None:
            raise InvalidRequest(f"{self.architecture} has no sparse head", param="sparse")
        if self.head.per_token:
            vectors = [self._per_token(rows.item(i)[:, 0], ids) for i, ids in enumerate(token_lists)]
        else:
            vectors = [_nonzero(rows.values[i]) for i in range(len(rows))]
        tokens = [self.encoder.token_strs(ids.tolist()) for ids, _ in vectors] if params.return_tokens else None
        return sparse_rows(vectors), tokens

    def _per_token(self, weights: np.ndarray, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each token id's highest weight; (T_kept,) weights for ``token_ids`` less the head's skipped ends."""
        head = self.head
        assert head is not None
        ids = np.asarray(token_ids[head.skip_first : len(token_ids) - head.skip_last], dtype=np.int64)
        if len(ids) != len(weights):
            raise ValueError(f"{len(weights)} token weights for {len(ids)} tokens")
        unique, where = np.unique(ids, return_inverse=True)  # (u,), (T_kept,)
        best = np.full(len(unique), -np.inf, dtype=np.float32)
        np.maximum.at(best, where, weights.astype(np.float32))
        keep = (best > 0) & ~np.isin(unique, self.unused)
        return unique[keep], best[keep]


def _nonzero(vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(vocab,) weights → the ids with a positive weight, and those weights."""
    ids = np.flatnonzero(vector > 0)
    return ids.astype(np.int64), vector[ids].astype(np.float32)
