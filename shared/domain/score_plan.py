"""One score plan (torch-free): (query, document) pairs → one call's inputs, that call's rows → one score per pair.

The score routes (``gateway.dialects.pairs``) and the offline API
(``workers.offline``) both build a ``ScorePlan`` with ``plan_scores`` and read
their scores back with ``ScorePlan.scores``, so pairing, caps and the scorer
are decided once:

- pairing is vLLM's (1:1, 1:N, N:N; ``shared.domain.scoring.check_pairs``);
- the scorer is the model's active task's (the first of ``ModelInfo.tasks``,
  ``shared.domain.tasks.SCORE_TYPES``): a one-label cross-encoder (``classify``)
  reads each pair as one sequence (a ``TextPair``), a bi-encoder (``embed``)
  or late-interaction model (``token_embed``) pools each query and each
  document once, queries first, and is scored by cosine / MaxSim;
- per-side caps (vLLM's ``max_tokens_per_query`` / ``max_tokens_per_doc``, 0 =
  off) must be below ``max_model_len`` and cut each side to that many content
  tokens in the worker (``TextPair`` / ``CappedText`` caps);
- long documents (a ``WindowSpec``: Cohere's ``max_chunks_per_doc``, a token
  overlap, a fold) travel as ``WindowedText``: the worker reads each window as
  its own pair (cross-encoder) or text (bi-encoder, late interaction) and
  answers one row per window; each window is scored against its query and a
  document's score is the max (default) or mean of its windows' scores
  (``shared.domain.windows.fold``), its best window's span named. Without a spec the
  plan is vLLM's.
- images (``MediaInput`` queries or documents, ``shared.wire.media``): a bi-encoder or
  late-interaction model pools them like texts (the queries' and documents'
  roles named); a cross-encoder reads one pair as ONE input,
  ``MediaInput(parts=(document parts..., query), role="pair")`` (the query,
  one text or one image, last, as jina-reranker-m0's prompt puts it), its
  media plan laying it out (an ``instruction`` goes with it, as the pair's
  ``chat_template_kwargs``, for a prompt with a place for one); caps and
  windows apply to text pairs only.
- a model whose queries and documents encode differently (``ModelInfo.input_roles``:
  PyLate's markers and query expansion) is told the queries come first
  (``PoolingParams.query_inputs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.scoring import SCORERS, check_pairs, query_of
from poolgate.shared.domain.tasks import SCORE_TYPES, PoolingTask
from poolgate.shared.domain.windows import FOLDS, WindowedText, Windows, fold
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import CappedText, Input, ModelInfo, TextPair, only_texts
from poolgate.shared.wire.rows import Rows

CROSS_ENCODER_TEXTS = "a cross-encoder scores texts: pass the queries and documents as strings"
CAPPED_TEXTS = "max_tokens_per_query and max_tokens_per_doc cut texts: pass the inputs as strings"
WINDOWED_TEXTS = "max_chunks_per_doc cuts texts into windows: pass the documents as strings"
CROSS_ENCODER_QUERIES = "a cross-encoder's query with images is one text or one image"
MEDIA_PAIRS = "max_tokens_per_query and max_tokens_per_doc apply to text pairs, not to pairs with images"
PAIR = "pair"  # a MediaInput's role: one (document, query) pair a cross-encoder reads as one sequence


@dataclass(frozen=True)
class SideCaps:
    """Content-token caps per side (vLLM's ``max_tokens_per_query`` / ``max_tokens_per_doc``; 0 = off)."""

    query: int = 0
    document: int = 0


@dataclass(frozen=True)
class WindowSpec:
    """Long documents in windows: at most ``max_chunks`` windows each, ``overlap`` tokens shared by
    consecutive windows, and how window scores fold into the document's (``shared.domain.windows.FOLDS``)."""

    max_chunks: int
    overlap: int = 0
    fold: str = "max"


@dataclass(frozen=True)
class PairScores:
    """One score per pair, in document order; with windows, each document's best window (index, start, end)."""

    values: np.ndarray  # (pairs,) float32
    best: list[tuple[int, int, int]] | None = None


def scoring_enabled(info: ModelInfo) -> bool:
    """vLLM's enable_scoring_api: the active task scores pairs (a classifier only with one label)."""
    task = info.tasks[0] if info.tasks else None
    if task not in SCORE_TYPES:
        return False
    return task != "classify" or info.embedding_dim == 1


def scorer_of(info: ModelInfo) -> str:
    """The scorer of the model's active task (a ``SCORE_TYPES`` value); 400 when it scores no pairs."""
    task = info.tasks[0] if info.tasks else None
    kind = SCORE_TYPES.get(task) if task is not None else None
    if kind is None:
        raise InvalidRequest(
            f"Scoring API is not supported by this model (its task is {task!r}); "
            "scoring needs an embed, token_embed or classify model."
        )
    if kind == "cross-encoder" and info.embedding_dim != 1:
        raise InvalidRequest("Scoring API is only enabled for num_labels == 1.")
    return kind


def check_windows(info: ModelInfo, spec: WindowSpec) -> None:
    """A window spec the worker can cut (the overlap against the window itself is checked there)."""
    if isinstance(spec.max_chunks, bool) or not isinstance(spec.max_chunks, int) or spec.max_chunks < 1:
        raise InvalidRequest(
            f"max_chunks_per_doc must be at least 1, got {spec.max_chunks!r}.", param="max_chunks_per_doc"
        )
    if isinstance(spec.overlap, bool) or not isinstance(spec.overlap, int) or spec.overlap < 0:
        raise InvalidRequest(
            f"chunk_overlap must be a non-negative integer, got {spec.overlap!r}.", param="chunk_overlap"
        )
    if spec.overlap >= info.max_model_len:
        raise InvalidRequest(
            f"chunk_overlap ({spec.overlap}) must be smaller than the window, which is at "
            f"most max_model_len ({info.max_model_len}) tokens.",
            param="chunk_overlap",
        )
    if spec.fold not in FOLDS:
        raise InvalidRequest(
            f"chunk_aggregation must be one of {', '.join(FOLDS)}, got {spec.fold!r}.", param="chunk_aggregation"
        )


def check_caps(info: ModelInfo, caps: SideCaps) -> None:
    """vLLM's rule: a per-side cap must be below max_model_len (0 = off)."""
    for name, value in (("max_tokens_per_query", caps.query), ("max_tokens_per_doc", caps.document)):
        if value and value >= info.max_model_len:
            raise InvalidRequest(
                f"{name} ({value}) must be less than max_model_len ({info.max_model_len}).", param=name
            )


@dataclass(frozen=True)
class ScorePlan:
    """One call that scores ``n_documents`` pairs: its inputs, its task, and how its rows become scores."""

    kind: str  # a shared.domain.tasks.SCORE_TYPES value
    task: PoolingTask
    n_queries: int
    n_documents: int
    inputs: list[Input]
    windows: WindowSpec | None = None
    query_inputs: int | None = None  # a model with input roles (PyLate): the queries come first

    def params(self, **fields: Any) -> PoolingParams:
        """The call's pooling params: the scorer's task, with ``fields`` (truncation, activation); a model
        with input roles (``ModelInfo.input_roles``) is told which inputs are the queries."""
        return PoolingParams(task=self.task, query_inputs=self.query_inputs, **fields)

    def scores(self, rows: Rows, windows: Windows | None = None) -> PairScores:
        """One score per pair, in document order, from the call's rows (one per window with ``windows``)."""
        if self.windows is None:
            return PairScores(SCORERS[self.kind](rows, self.n_queries, None))
        if windows is None:
            raise ValueError("a windowed score call's result has no windows")
        skip = 0 if self.kind == "cross-encoder" else self.n_queries  # the queries' own rows come first
        counts, spans = list(windows.counts[skip:]), list(windows.spans[skip:])
        pair_query = query_of(self.n_queries, self.n_documents)
        index = [pair_query[doc] for doc, count in enumerate(counts) for _ in range(count)]  # query per window
        folded = fold(SCORERS[self.kind](rows, self.n_queries, index), counts, spans, self.windows.fold)
        return PairScores(folded.scores, folded.best)


def plan_scores(
    info: ModelInfo,
    queries: Sequence[Input],
    documents: Sequence[Input],
    caps: SideCaps = SideCaps(),
    instruction: str | None = None,
    windows: WindowSpec | None = None,
) -> ScorePlan:
    """The plan for scoring ``queries`` against ``documents`` with ``info``'s own scorer."""
    check_pairs(len(queries), len(documents))
    kind = scorer_of(info)
    check_caps(info, caps)
    pair_query = query_of(len(queries), len(documents))
    inputs: list[Input]
    if windows is not None:
        check_windows(info, windows)
        docs = _texts(documents, WINDOWED_TEXTS, param="documents")
        if kind == "cross-encoder":
            texts = _texts(queries, CROSS_ENCODER_TEXTS)
            inputs = [
                WindowedText(d, windows.max_chunks, windows.overlap, texts[q], instruction, caps.query, caps.document)
                for q, d in zip(pair_query, docs, strict=True)
            ]
        else:
            inputs = [_capped(q, caps.query) for q in queries] + [
                WindowedText(d, windows.max_chunks, windows.overlap, max_tokens=caps.document) for d in docs
            ]
    elif kind == "cross-encoder" and any(isinstance(x, MediaInput) for x in [*queries, *documents]):
        inputs = _media_pairs(queries, documents, pair_query, caps, instruction)
    elif kind == "cross-encoder":
        texts = _texts([*queries, *documents], CROSS_ENCODER_TEXTS)
        inputs = [
            TextPair(texts[q], d, caps.query, caps.document, instruction)
            for q, d in zip(pair_query, texts[len(queries) :], strict=True)
        ]
    else:
        inputs = [_capped(q, caps.query) for q in queries] + [_capped(d, caps.document) for d in documents]
    roles = len(queries) if info.input_roles and kind != "cross-encoder" else None
    return ScorePlan(kind, info.tasks[0], len(queries), len(documents), inputs, windows, roles)


def _texts(inputs: Sequence[Input], message: str, param: str | None = None) -> list[str]:
    """``inputs`` when every one is a text; else the 400 ``message``."""
    texts = only_texts(inputs)
    if texts is None:
        raise InvalidRequest(message, param=param)
    return texts


def _media_pairs(
    queries: Sequence[Input], documents: Sequence[Input], pair_query: list[int], caps: SideCaps, instruction: str | None
) -> list[Input]:
    """A cross-encoder's pairs with images: each one ``MediaInput`` of the document's parts, then the query's one
    part (a text or one image); pairs of texts stay ``TextPair``s."""
    if caps.query or caps.document:
        raise InvalidRequest(MEDIA_PAIRS, param="documents")
    options = {"instruction": instruction} if instruction is not None else None  # the plan's prompt places it
    sides: list[str | MediaRef] = []
    for x in queries:
        if isinstance(x, MediaInput) and len(x.parts) == 1:
            sides.append(x.parts[0])
        elif isinstance(x, str):
            sides.append(x)
        else:
            raise InvalidRequest(CROSS_ENCODER_QUERIES, param="queries")
    pairs: list[Input] = []
    for q, d in zip(pair_query, documents, strict=True):
        query = sides[q]
        if isinstance(d, MediaInput):
            pairs.append(MediaInput(parts=(*d.parts, query), role=PAIR, chat_template_kwargs=options))
        elif isinstance(d, str) and isinstance(query, str):
            pairs.append(TextPair(query, d, instruction=instruction))
        elif isinstance(d, str):
            pairs.append(MediaInput(parts=(d, query), role=PAIR, chat_template_kwargs=options))
        else:
            raise InvalidRequest(CROSS_ENCODER_TEXTS, param="documents")
    return pairs


def _capped(x: Input, cap: int) -> Input:
    if not cap:
        return x
    if not isinstance(x, str):
        raise InvalidRequest(CAPPED_TEXTS)
    return CappedText(x, cap)
