"""Pair inputs on the wire (TextPair, CappedText), their checks, and shared.domain.scoring's pairing and scores."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.limits import check_inputs
from poolgate.shared.wire.rows import Rows
from poolgate.shared.domain.scoring import check_pairs, cosine_scores, cross_encoder_scores, maxsim, maxsim_scores, query_of
from poolgate.shared.wire.messages import CappedText, TextPair
from tests.fakes import fake_model

INFO = fake_model().info


def test_pairs_are_for_a_cross_encoder_only():
    check_inputs(INFO, [TextPair("a", "b")], "classify")
    check_inputs(INFO, [TextPair("a", "b")])  # task unknown (the gateway): the worker checks it
    with pytest.raises(InvalidRequest, match="not by task 'embed'"):
        check_inputs(INFO, [TextPair("a", "b")], "embed")
    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        check_inputs(INFO, [TextPair("a", "\ud800")], "classify")
    with pytest.raises(InvalidRequest, match="non-negative"):
        check_inputs(INFO, [CappedText("a", -1)], "embed")


@pytest.mark.parametrize("n_q,n_d,message", [
    (2, 3, "Input lengths must be either 1:1, 1:N or N:N"),
    (0, 2, "At least one text element must be given"),
    (1, 0, "At least one text_pair element must be given"),
    (3, 0, "Input lengths must be either 1:1, 1:N or N:N"),  # vLLM checks the lengths first
])
def test_pairing_errors_are_vllms(n_q, n_d, message):
    with pytest.raises(InvalidRequest, match=message.replace("(", r"\(")):
        check_pairs(n_q, n_d)


def test_scores_from_rows():
    assert query_of(1, 3) == [0, 0, 0] and query_of(2, 2) == [0, 1]
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(5, 8)).astype(np.float32)  # 1 query, 4 documents
    want = [float(vectors[0] @ v / np.linalg.norm(vectors[0]) / np.linalg.norm(v)) for v in vectors[1:]]
    np.testing.assert_allclose(cosine_scores(Rows(vectors), 1), want, rtol=1e-6)
    pairwise = cosine_scores(Rows(vectors[:4]), 2)  # queries 0, 1 with documents 2, 3
    np.testing.assert_allclose(pairwise, [cosine_scores(Rows(vectors[[0, 2]]), 1)[0],
                                          cosine_scores(Rows(vectors[[1, 3]]), 1)[0]], rtol=1e-6)
    assert cosine_scores(Rows(np.zeros((2, 3), np.float32)), 1).tolist() == [0.0]  # zero vectors: no NaN
    tokens = Rows(rng.normal(size=(9, 4)).astype(np.float32), np.array([0, 2, 5, 9]))  # query of 2 tokens, 2 docs
    np.testing.assert_allclose(maxsim_scores(tokens, 1), [maxsim(tokens.item(0), tokens.item(i)) for i in (1, 2)])
    a, b = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.6, 0.8], [1.0, 0.0], [0.0, -1.0]])
    assert maxsim(a, b) == pytest.approx(1.8)
    assert cross_encoder_scores(Rows(np.array([[0.3], [0.9]], np.float32)), 1).tolist() == pytest.approx([0.3, 0.9])
