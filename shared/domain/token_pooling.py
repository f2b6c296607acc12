"""Token pooling for late-interaction document vectors: Ward clustering of a document's token vectors, cluster means.

PyLate's hierarchical pooling, server-side: a document's first token ([CLS])
is kept as it is, the rest (n vectors) are clustered into ``max(n //
pool_factor, 1)`` clusters by Ward's method on the cosine distance ``1 −
a·b`` (the vectors are L2-normalized), and each cluster is replaced by the mean
of its vectors (not re-normalized, as PyLate). Ward's merges follow the
Lance–Williams update, two clusters at a time, the closest pair first, until
the target count is left (what cutting the dendrogram at that many clusters
gives). A document with no more tokens than clusters is returned whole.
Torch-free: numpy only, O(n²) memory and O(n²) work per merge.
"""

from __future__ import annotations

import numpy as np

PROTECTED_TOKENS = 1  # the leading [CLS] vector, kept out of the clustering (PyLate's default)


def ward_clusters(vectors: np.ndarray, k: int) -> np.ndarray:
    """(n,) cluster label in [0, k) of each of ``vectors`` (n, dim), merged by Ward on ``1 − cosine``."""
    n = len(vectors)
    x = vectors.astype(np.float64)
    dist = 1.0 - x @ x.T  # (n, n)
    np.fill_diagonal(dist, np.inf)
    size = np.ones(n)
    alive = np.ones(n, dtype=bool)
    label = np.arange(n)
    for _ in range(n - k):
        flat = int(np.argmin(dist))
        i, j = divmod(flat, n)
        i, j = min(i, j), max(i, j)
        ni, nj, nk = size[i], size[j], size
        merged = np.sqrt(
            np.maximum(
                ((nk + ni) * dist[i] ** 2 + (nk + nj) * dist[j] ** 2 - nk * dist[i, j] ** 2) / (ni + nj + nk), 0.0
            )
        )  # (n,) Lance–Williams for Ward
        merged[~alive] = np.inf
        dist[i], dist[:, i] = merged, merged
        dist[i, i] = np.inf
        dist[j], dist[:, j] = np.inf, np.inf
        alive[j], size[i] = False, ni + nj
        label[label == j] = i
    return np.unique(label, return_inverse=True)[1]


def pool_tokens(vectors: np.ndarray, pool_factor: int) -> np.ndarray:
    """(m, dim) pooled vectors of one document's (t, dim) token vectors; m ≈ 1 + (t − 1) / pool_factor."""
    if pool_factor <= 1:
        return vectors
    protected, rest = vectors[:PROTECTED_TOKENS], vectors[PROTECTED_TOKENS:]
    k = max(len(rest) // pool_factor, 1)
    if k >= len(rest):
        return vectors
    labels = ward_clusters(rest, k)
    sums = np.zeros((k, vectors.shape[1]), dtype=np.float64)
    np.add.at(sums, labels, rest.astype(np.float64))
    means = sums / np.bincount(labels, minlength=k)[:, None]
    return np.concatenate([protected, means.astype(vectors.dtype)])
