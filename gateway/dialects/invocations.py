"""SageMaker's ``POST /invocations``: one body, dispatched by its shape to the first route that takes it.

As vLLM does, the candidates are tried in order, each only where the model
(named in the body, else the default) offers it: embeddings (active task
embed), classification (active task classify), rerank and score (scoring
enabled), then raw pooling. The first whose request model validates the body
answers it, exactly as its own route would (same handler, same response). A
body that fits none is vLLM's 400 "Cannot find suitable handler for request.
Expected one of: [...]", naming the candidates that were offered; a body a
candidate refuses while validating (a removed parameter such as ``normalize``
included) counts as not fitting it, as a pydantic error does in vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import RootModel, ValidationError

from poolgate.gateway.dialects import openai, rerank, vllm_classify, vllm_pooling, vllm_score
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.http.state import ROUTER
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.score_plan import scoring_enabled
from poolgate.shared.wire.messages import ModelInfo


class InvocationBody(RootModel[dict[str, Any]]):
    """Any JSON object: one of the bodies of the routes below."""


@dataclass(frozen=True)
class Candidate:
    route: Route
    offered: Callable[[ModelInfo], bool]


def _active(task: str) -> Callable[[ModelInfo], bool]:
    return lambda info: bool(info.tasks) and info.tasks[0] == task


# vLLM's order.
CANDIDATES: tuple[Candidate, ...] = (
    Candidate(openai.ROUTES[0], _active("embed")),
    Candidate(vllm_classify.ROUTES[0], _active("classify")),
    Candidate(rerank.ROUTES[0], scoring_enabled),
    Candidate(vllm_score.ROUTES[0], scoring_enabled),
    Candidate(vllm_pooling.ROUTES[0], lambda info: True),
)


async def invoke(request: web.Request, body: InvocationBody) -> web.StreamResponse:
    raw = body.root
    info = request.app[ROUTER].lookup(raw.get("model") if isinstance(raw.get("model"), str) else None).info
    offered = [(c.route, c.route.request_model) for c in CANDIDATES if c.offered(info)]
    for route, model in offered:
        try:
            parsed = model.model_validate(raw) if model is not None else None
        except (ValidationError, InvalidRequest):
            continue
        return await route.handler(request, parsed)
    names = [model.__name__ for _, model in offered if model is not None]
    raise InvalidRequest(f"Cannot find suitable handler for request. Expected one of: {names}")


ROUTES = (
    Route(
        "POST",
        "/invocations",
        invoke,
        InvocationBody,
        summary="SageMaker: the body's shape picks embeddings, classify, rerank, score or pooling",
    ),
)
