"""Pooling methods over packed hidden states: CLS, MEAN, LAST per sequence; ALL per token.

A sequence method turns ``(n_tokens, hidden)`` into ``(n_seqs, hidden)``; a
token method keeps rows per token, which the pooler returns with offsets.
Hidden states come in the model's dtype: CLS and LAST only pick rows (the
pooler casts them), MEAN sums in fp32. The references live with the kernels
(``workers.kernels.pooling``); a pooler runs its ops bundle's (``Ops.pooling``).
"""
from __future__ import annotations

from poolgate.workers.kernels.pooling import POOLING, PoolingMethod, all_pool, cls_pool, last_pool, mean_pool

__all__ = ["POOLING_TYPES", "TOKEN_POOLING_TYPES", "PoolingMethod", "all_pool", "cls_pool", "last_pool", "mean_pool"]

POOLING_TYPES: dict[str, PoolingMethod] = dict(POOLING)  # the references (workers.kernels.pooling), by name
TOKEN_POOLING_TYPES = frozenset({"ALL", "STEP"})  # the methods that keep rows per token
