"""vLLM's score route: ``POST /score`` (and ``/v1/score``), its four pair forms and its response.

A body names its two sides in one of vLLM's four ways: ``queries`` +
``documents``, ``queries`` + ``items``, ``data_1`` + ``data_2`` or ``text_1`` +
``text_2``; each side is one input or a list (a text, Jina's ``{"text"}`` or
``{"image"}``, or vLLM's multimodal ``{"content": [parts]}``, one input of text
and images; ``dialects.pairs``), a model that reads text only refusing images. Pairs are 1:1,
1:N or N:N (``shared.domain.scoring.check_pairs``, vLLM's messages). The response is
vLLM's ``ScoreResponse``: ``{id: "score-…", object: "list", created, model,
data: [{index, object: "score", score}], usage}``, one item per pair in order.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from pydantic import BaseModel, model_validator

from poolgate.gateway.dialects.encoding import dumps
from poolgate.gateway.dialects.envelope import list_response
from poolgate.gateway.dialects.pairs import Scored, ScoreInputs, ScoringBody, score_pairs
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.serving import record_answer
from poolgate.shared.domain.score_plan import scoring_enabled

PATHS = ("/score", "/v1/score")
# vLLM's pair forms, in the order its request union tries them: (first side, second side).
PAIR_FORMS: tuple[tuple[str, str], ...] = (
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
    ("text_1", "text_2"),
)


class ScoreRequest(ScoringBody):
    """The body of ``POST /score``: one of the pair forms, plus the scoring fields."""

    queries: ScoreInputs | None = None
    documents: ScoreInputs | None = None
    items: ScoreInputs | None = None
    data_1: ScoreInputs | None = None
    data_2: ScoreInputs | None = None
    text_1: ScoreInputs | None = None
    text_2: ScoreInputs | None = None

    @model_validator(mode="after")
    def _one_pair_form(self) -> ScoreRequest:
        self.sides()
        return self

    def sides(self) -> tuple[Any, Any]:
        """The (first, second) side of the first pair form the body fills."""
        for first, second in PAIR_FORMS:
            a, b = getattr(self, first), getattr(self, second)
            if a is not None and b is not None:
                return a, b
        forms = ", ".join(f"{a} + {b}" for a, b in PAIR_FORMS)
        raise ValueError(f"a score request needs one pair of inputs: {forms}")


class ScoreItem(BaseModel):
    index: int
    object: str = "score"
    score: float
    best_chunk: dict[str, int] | None = None  # with max_chunks_per_doc: the best window's index and span


class ScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreItem]
    usage: dict[str, Any]


def to_response(scored: Scored, *, created: int) -> dict:
    """vLLM's ScoreResponse: one item per pair, in pair order."""
    data = [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scored.scores)]
    if scored.best is not None:  # max_chunks_per_doc: each pair's best window
        for i, item in enumerate(data):
            item["best_chunk"] = scored.best_chunk(i)
    return list_response("score", scored.served, data, created=created)


async def create_score(request: web.Request, req: ScoreRequest) -> web.Response:
    queries, documents = req.sides()
    scored = await score_pairs(request, req, queries, documents)
    body = to_response(scored, created=int(time.time()))
    record_answer(request, body["id"])
    return web.Response(body=dumps(body), content_type="application/json")


ROUTES = tuple(
    Route(
        "POST",
        path,
        create_score,
        ScoreRequest,
        ScoreResponse,
        serves=scoring_enabled,
        operation="score",
        summary="vLLM score: query/document pair scores",
    )
    for path in PATHS
)
