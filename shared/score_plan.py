"""One score plan (torch-free): (query, document) pairs → one call's inputs, that call's rows → one score per pair.

The score routes (``gateway.dialects.pairs``) and the offline API
(``workers.offline``) both build a ``ScorePlan`` with ``plan_scores`` and read
their scores back with ``ScorePlan.scores``, so pairing, caps and the scorer
are decided once:

- pairing is vLLM's (1:1, 1:N, N:N; ``shared.scoring.check_pairs``);
- the scorer is the model's active task's (the first of ``ModelInfo.tasks``,
  ``shared.tasks.SCORE_TYPES``): a one-label cross-encoder (``classify``)
  reads each pair as one sequence (a ``TextPair``), a bi-encoder (``embed``)
  or late-interaction model (``token_embed``) pools each query and each
  document once, queries first, and is scored by cosine / MaxSim;
- per-side caps (vLLM's ``max_tokens_per_query`` / ``max_tokens_per_doc``, 0 =
  off) must be below ``max_model_len`` and cut each side to that many content
  tokens in the worker (``TextPair`` / ``CappedText`` caps).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from poolgate.shared.errors import InvalidRequest
from poolgate.shared.params import PoolingParams
from poolgate.shared.rows import Rows
from poolgate.shared.scoring import SCORERS, check_pairs, query_of
from poolgate.shared.tasks import SCORE_TYPES
from poolgate.shared.wire import CappedText, Input, ModelInfo, TextPair

CROSS_ENCODER_TEXTS = "a cross-encoder scores texts: pass the queries and documents as strings"
CAPPED_TEXTS = "max_tokens_per_query and max_tokens_per_doc cut texts: pass the inputs as strings"


@dataclass(frozen=True)
class SideCaps:
    """Content-token caps per side (vLLM's ``max_tokens_per_query`` / ``max_tokens_per_doc``; 0 = off)."""

    query: int = 0
    document: int = 0


def scoring_enabled(info: ModelInfo) -> bool:
    """vLLM's enable_scoring_api: the active task scores pairs (a classifier only with one label)."""
    task = info.tasks[0] if info.tasks else None
    if task not in SCORE_TYPES:
        return False
    return task != "classify" or info.embedding_dim == 1


def scorer_of(info: ModelInfo) -> str:
    """The scorer of the model's active task (a ``SCORE_TYPES`` value); 400 when it scores no pairs."""
    task = info.tasks[0] if info.tasks else None
    kind = SCORE_TYPES.get(task)
    if kind is None:
        raise InvalidRequest(f"Scoring API is not supported by this model (its task is {task!r}); "
                             "scoring needs an embed, token_embed or classify model.")
    if kind == "cross-encoder" and info.embedding_dim != 1:
        raise InvalidRequest("Scoring API is only enabled for num_labels == 1.")
    return kind


def check_caps(info: ModelInfo, caps: SideCaps) -> None:
    """vLLM's rule: a per-side cap must be below max_model_len (0 = off)."""
    for name, value in (("max_tokens_per_query", caps.query), ("max_tokens_per_doc", caps.document)):
        if value and value >= info.max_model_len:
            raise InvalidRequest(f"{name} ({value}) must be less than max_model_len ({info.max_model_len}).",
                                 param=name)


@dataclass(frozen=True)
class ScorePlan:
    """One call that scores ``n_documents`` pairs: its inputs, its task, and how its rows become scores."""

    kind: str  # a shared.tasks.SCORE_TYPES value
    task: str
    n_queries: int
    n_documents: int
    inputs: list[Input]

    def params(self, **fields) -> PoolingParams:
        """The call's pooling params: the scorer's task, with ``fields`` (truncation, activation)."""
        return PoolingParams(task=self.task, **fields)

    def scores(self, rows: Rows) -> np.ndarray:
        """(pairs,) float32 scores, in document order, from the call's rows."""
        return SCORERS[self.kind](rows, self.n_queries)


def plan_scores(info: ModelInfo, queries: list[Input], documents: list[Input], caps: SideCaps = SideCaps(),
                instruction: str | None = None) -> ScorePlan:
    """The plan for scoring ``queries`` against ``documents`` with ``info``'s own scorer."""
    check_pairs(len(queries), len(documents))
    kind = scorer_of(info)
    check_caps(info, caps)
    if kind == "cross-encoder":
        if not all(isinstance(x, str) for x in (*queries, *documents)):
            raise InvalidRequest(CROSS_ENCODER_TEXTS)
        inputs: list[Input] = [TextPair(queries[q], d, caps.query, caps.document, instruction)
                               for q, d in zip(query_of(len(queries), len(documents)), documents)]
    else:
        inputs = [_capped(q, caps.query) for q in queries] + [_capped(d, caps.document) for d in documents]
    return ScorePlan(kind, info.tasks[0], len(queries), len(documents), inputs)


def _capped(x: Input, cap: int) -> Input:
    if not cap:
        return x
    if not isinstance(x, str):
        raise InvalidRequest(CAPPED_TEXTS)
    return CappedText(x, cap)
