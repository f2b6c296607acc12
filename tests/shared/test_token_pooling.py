"""Token pooling (PyLate's hierarchical pooling) against scipy's Ward clustering, which PyLate itself calls."""
import numpy as np
import pytest
from scipy.cluster import hierarchy

from poolgate.shared.domain.token_pooling import pool_tokens, ward_clusters


def _unit(rng, n, dim=16):
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("n, k", [(10, 5), (31, 15), (64, 21), (150, 75)])
def test_the_clusters_are_scipys_ward_cut_at_k(n, k):
    x = _unit(np.random.default_rng(n), n)
    condensed = (1.0 - x.astype(np.float64) @ x.T.astype(np.float64))[np.triu_indices(n, 1)]
    want = hierarchy.fcluster(hierarchy.linkage(condensed, method="ward"), t=k, criterion="maxclust")
    got = ward_clusters(x, k)
    assert {frozenset(np.flatnonzero(want == c)) for c in set(want)} == \
           {frozenset(np.flatnonzero(got == c)) for c in set(got)}


def test_pooled_vectors_are_cluster_means_after_the_kept_cls():
    x = _unit(np.random.default_rng(1), 41)
    out = pool_tokens(x, 2)
    assert out.shape == (1 + 20, 16) and np.array_equal(out[0], x[0])
    labels = ward_clusters(x[1:], 20)
    want = np.stack([x[1:][labels == c].mean(0) for c in range(20)])
    np.testing.assert_allclose(out[1:], want, atol=1e-6)


def test_short_documents_and_factor_one_are_returned_whole():
    x = _unit(np.random.default_rng(2), 3)
    assert pool_tokens(x, 1) is x
    np.testing.assert_allclose(pool_tokens(x, 4), np.stack([x[0], x[1:].mean(0)]), atol=1e-6)  # CLS + one cluster
    assert pool_tokens(x[:2], 3) is x[:2] or np.array_equal(pool_tokens(x[:2], 3), x[:2])
