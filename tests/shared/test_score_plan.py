"""shared.domain.score_plan: one plan for the score routes and the offline API (pairing, scorer, caps, inputs, scores)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.wire.rows import Rows
from poolgate.shared.domain.score_plan import SideCaps, plan_scores, scorer_of, scoring_enabled
from poolgate.shared.wire.messages import CappedText, TextPair
from tests.fakes import fake_model

EMBED = fake_model().info  # max_model_len 32
CROSS = replace(EMBED, tasks=("classify",), embedding_dim=1)
LATE = replace(EMBED, tasks=("token_embed", "embed"))


def test_the_active_task_picks_the_scorer():
    assert [scorer_of(i) for i in (EMBED, CROSS, LATE)] == ["bi-encoder", "cross-encoder", "late-interaction"]
    three_labels = replace(CROSS, embedding_dim=3)
    assert not scoring_enabled(three_labels) and scoring_enabled(CROSS)
    with pytest.raises(InvalidRequest, match="only enabled for num_labels == 1"):
        scorer_of(three_labels)
    with pytest.raises(InvalidRequest, match="Scoring API is not supported"):
        scorer_of(replace(EMBED, tasks=("token_classify",)))


def test_a_cross_encoder_gets_one_pair_per_document_with_both_caps():
    plan = plan_scores(CROSS, ["q"], ["d1", "d2"], SideCaps(3, 5), "inst")
    assert plan.inputs == [TextPair("q", "d1", 3, 5, "inst"), TextPair("q", "d2", 3, 5, "inst")]
    assert plan.params(use_activation=False).task == "classify"
    pairwise = plan_scores(CROSS, ["q1", "q2"], ["d1", "d2"])
    assert [p.text for p in pairwise.inputs] == ["q1", "q2"]
    np.testing.assert_array_equal(plan.scores(Rows(np.array([[0.25], [0.75]], np.float32))).values, [0.25, 0.75])
    with pytest.raises(InvalidRequest, match="cross-encoder scores texts"):
        plan_scores(CROSS, [[1, 2]], ["d"])


def test_a_bi_encoder_pools_each_side_once_capped():
    plan = plan_scores(EMBED, ["q"], ["d1", "d2"], SideCaps(0, 4))
    assert plan.inputs == ["q", CappedText("d1", 4), CappedText("d2", 4)] and plan.n_queries == 1
    vectors = np.array([[1, 0], [1, 0], [0, 2]], np.float32)
    np.testing.assert_allclose(plan.scores(Rows(vectors)).values, [1.0, 0.0])
    assert plan_scores(EMBED, [[1, 2]], [[3]]).inputs == [[1, 2], [3]]  # token ids, uncapped
    with pytest.raises(InvalidRequest, match="cut texts"):
        plan_scores(EMBED, [[1, 2]], ["d"], SideCaps(2, 0))


@pytest.mark.parametrize("caps,name", [(SideCaps(32, 0), "max_tokens_per_query"),
                                       (SideCaps(0, 40), "max_tokens_per_doc")])
def test_side_caps_must_be_below_max_model_len(caps, name):
    with pytest.raises(InvalidRequest, match=rf"{name} \(\d+\) must be less than max_model_len \(32\)"):
        plan_scores(EMBED, ["q"], ["d"], caps)


def test_pairing_is_checked_first():
    with pytest.raises(InvalidRequest, match="1:1, 1:N or N:N"):
        plan_scores(replace(EMBED, tasks=("token_classify",)), ["a", "b"], ["c", "d", "e"])
