"""The rerank routes: ``POST /rerank``, ``/v1/rerank`` (vLLM / Jina) and ``/v2/rerank`` (also Cohere v2).

The body is vLLM's ``RerankRequest`` (Jina's shape): ``query``, ``documents``
(one or a list; texts, Jina's ``{"text"}`` / ``{"image"}`` objects or vLLM's
``{"content": [parts]}``, ``dialects.pairs``), ``top_n`` (0 or absent
= all) and the scoring fields (``dialects.pairs``), plus ``return_documents``
(default true), which vLLM ignores and poolgate honours; Cohere's SDK sends
``max_tokens_per_doc`` and ``priority``, which mean the same here.

One response satisfies all three clients: vLLM's ``{id: "score-…", model,
usage: {prompt_tokens, total_tokens}, results: [{index, document: {text,
multi_modal}, relevance_score}]}`` (a text document echoes its ``text``, an
image one its parts in ``multi_modal``, as vLLM does) plus Cohere's ``meta: {api_version:
{version: "2"}, billed_units: {search_units}, tokens: {input_tokens}}``
(one search unit per query and up to 100 documents, as Cohere bills). With
``max_chunks_per_doc`` (``dialects.pairs``) long documents are read in windows
and each result names its best one (``best_chunk``).
Results are sorted by score, highest first (ties keep document order), then
cut to ``top_n``. ``/v2/rerank`` answers errors in Cohere's ``{"message"}``
shape; the other two in vLLM's.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
from aiohttp import web
from pydantic import BaseModel, Field

from poolgate.gateway.dialects.encoding import dumps
from poolgate.gateway.dialects.pairs import Scored, ScoreInput, ScoreInputs, ScoringBody, echo, score_pairs
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.http.state import CONFIG
from poolgate.gateway.serving import record_answer
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.score_plan import scoring_enabled

DOCUMENTS_PER_SEARCH_UNIT = 100


class RerankRequest(ScoringBody):
    """The body of the rerank routes; unknown fields are allowed and ignored."""

    query: ScoreInput
    documents: ScoreInputs
    top_n: Annotated[int, Field(ge=0)] | None = 0
    return_documents: bool = True


class RerankResult(BaseModel):
    index: int
    document: dict[str, Any] | None = None
    relevance_score: float
    best_chunk: dict[str, int] | None = None  # with max_chunks_per_doc: the best window's index and span


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: dict[str, int]
    results: list[RerankResult]
    meta: dict[str, Any]


def ranking(scores: np.ndarray, top_n: int | None) -> list[int]:
    """Document indices by score, highest first (stable), cut to ``top_n`` (0 / None = all)."""
    order = np.argsort(-scores, kind="stable")
    return [int(i) for i in (order[:top_n] if top_n else order)]


def to_response(scored: Scored, documents: list[dict], *, top_n: int | None, return_documents: bool) -> dict:
    """The rerank body for ``scored`` (one score per document, in document order; ``documents``: each one's
    echo, ``dialects.pairs.echo``)."""
    served, tokens = scored.served, scored.served.result.total_tokens
    results = []
    for i in ranking(scored.scores, top_n):
        item: dict[str, Any] = {"index": i}
        if return_documents:
            item["document"] = documents[i]
        item["relevance_score"] = float(scored.scores[i])
        if (chunk := scored.best_chunk(i)) is not None:
            item["best_chunk"] = chunk
        results.append(item)
    units = math.ceil(len(documents) / DOCUMENTS_PER_SEARCH_UNIT)
    return {
        "id": f"score-{served.request_id}",
        "model": served.info.served_model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
        "meta": {
            "api_version": {"version": "2"},
            "billed_units": {"search_units": units},
            "tokens": {"input_tokens": tokens},
        },
    }


def check_documents(config: GatewayConfig, n: int) -> None:
    """``--max-documents-per-rerank`` (default: the input cap, which admission checks anyway)."""
    cap = config.max_documents_per_rerank
    if cap is not None and n > cap:
        raise InvalidRequest(
            f"Too many documents: {n} in one rerank request; the limit is {cap} (--max-documents-per-rerank).",
            param="documents",
        )


async def create_rerank(request: web.Request, req: RerankRequest) -> web.Response:
    documents = req.documents if isinstance(req.documents, list) else [req.documents]
    check_documents(request.app[CONFIG], len(documents))
    scored = await score_pairs(request, req, req.query, req.documents)
    body = to_response(scored, [echo(d) for d in documents], top_n=req.top_n, return_documents=req.return_documents)
    record_answer(request, body["id"])
    return web.Response(body=dumps(body), content_type="application/json")


ROUTES = tuple(
    Route(
        "POST",
        path,
        create_rerank,
        RerankRequest,
        RerankResponse,
        serves=scoring_enabled,
        operation="rerank",
        errors=errors,
        summary="Rerank documents by relevance to a query (vLLM / Jina / Cohere v2)",
    )
    for path, errors in (("/rerank", "openai"), ("/v1/rerank", "openai"), ("/v2/rerank", "cohere"))
)
