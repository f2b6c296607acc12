"""The API dialects as one route table: dialect name -> its ``Route`` values (``dialects.route``).

How to add routes (a new dialect, or new routes of one):

1. In your module, write ``async def handler(request, body)``: ``body`` is the
   request already validated into your pydantic ``request_model``; build a
   dialect-free ``ServeRequest``, ``await serving.serve(request, ...)`` and
   return the response. Do not catch: raise ``shared.domain.errors`` types.
2. List the module's routes as data::

       ROUTES = (
           Route("POST", "/v1/embeddings", create_embeddings, EmbeddingRequest,
                 response_model=EmbeddingResponse, tasks=("embed", "token_embed"),
                 summary="OpenAI embeddings"),
       )

   ``tasks``: the route exists only while some served model serves one of
   them (else 404), and a request naming a model that serves none of them
   gets vLLM's 400 "Unsupported task"; ``serves=`` takes a predicate on
   ``ModelInfo`` instead when tasks cannot say it. ``errors="cohere"`` makes
   the route's error bodies ``{"message": ...}`` (default: OpenAI's
   ``{"error": {...}}``). A route needs the API key unless ``public=True``
   and is counted and traced unless ``recorded=False``; the middleware reads
   these from the matched route, never from a list of paths.
3. Add the tuple to ``DIALECTS`` below. ``register`` mounts every route;
   ``gateway.http.openapi`` documents the same routes from the same models.
"""

from __future__ import annotations

from aiohttp import web

from poolgate.gateway.dialects import (
    cohere,
    invocations,
    io_processor,
    oip,
    openai,
    rerank,
    tei,
    tei_scores,
    tei_tokens,
    vllm_classify,
    vllm_pooling,
    vllm_score,
    vllm_tokenize,
)
from poolgate.gateway.dialects.route import Route, mount, shared

DIALECTS: dict[str, tuple[Route, ...]] = {
    "openai": openai.ROUTES,
    "cohere": cohere.ROUTES,
    "vllm_classify": vllm_classify.ROUTES,
    "vllm_pooling": vllm_pooling.ROUTES,
    "io_processor": io_processor.ROUTES,  # /pooling bodies with "data": the installed plugin's
    "vllm_score": vllm_score.ROUTES,
    "rerank": rerank.ROUTES,
    "vllm_tokenize": vllm_tokenize.ROUTES,
    "invocations": invocations.ROUTES,
    "tei": tei.ROUTES + tei_scores.ROUTES + tei_tokens.ROUTES,
    "oip": oip.ROUTES,  # the Open Inference Protocol (KServe v2, Triton); its gRPC side is gateway.grpc's
}


def all_routes() -> list[Route]:
    """Every dialect's routes, in table order; routes of one method and path become one ``shared`` route."""
    by_path: dict[tuple[str, str], list[Route]] = {}
    for routes in DIALECTS.values():
        for route in routes:
            by_path.setdefault((route.method, route.path), []).append(route)
    return [group[0] if len(group) == 1 else shared(group) for group in by_path.values()]


def register(app: web.Application, routes: list[Route] | None = None) -> None:
    """Mount ``routes`` (default: every dialect's) on ``app``."""
    for route in all_routes() if routes is None else routes:
        mount(app, route)
