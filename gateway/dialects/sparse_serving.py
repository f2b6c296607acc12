"""Sparse embeddings through the serving path, for any dialect: one call to the model's sparse head.

``serve_sparse`` sends the request's inputs to the model's sparse head
(``shared.domain.sparse``: SPLADE's vocabulary weights, BGE-M3's token weights),
with ``PoolingParams.sparse`` so the worker answers ``{token id: weight}``
per input, and gives each input's ``SparseVector`` (ids ascending, weights,
token strings with ``return_tokens``). A model without a sparse head is a
400 naming it. The OpenAI (``embedding_types`` extension) and Cohere
(``embedding_types: ["sparse"]``) dialects use it, and TEI's
``/embed_sparse`` can. ``serve_dense_and_sparse`` answers both from one call
and one forward: the sparse head is a further output of the dense call
(``PoolingParams.outputs``).
"""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from poolgate.gateway.http.state import CONFIG
from poolgate.gateway.serving import Served, ServeRequest, serve, with_policy
from poolgate.shared.domain.sparse import SparseVector, sparse_head, sparse_vector
from poolgate.shared.wire.messages import ModelInfo


def sparse_request(info: ModelInfo, req: ServeRequest, *, return_tokens: bool = False) -> ServeRequest:
    """``req`` (the dense request of the same inputs) turned to the model's sparse head; 400 without one."""
    head = sparse_head(info)
    params = replace(
        req.params, task=head.task, sparse=True, return_tokens=return_tokens, dimensions=None, use_activation=None
    )
    return replace(req, params=params)


async def serve_sparse(
    request: web.Request, info: ModelInfo, req: ServeRequest, *, return_tokens: bool = False
) -> tuple[Served, list[SparseVector]]:
    """Serve ``req``'s inputs through the sparse head: the served call and each input's sparse vector."""
    served = await serve(request, sparse_request(info, req, return_tokens=return_tokens))
    rows, tokens = served.result.outputs, served.result.tokens
    return served, [sparse_vector(rows, i, tokens) for i in range(len(rows))]


async def serve_dense_and_sparse(
    request: web.Request, info: ModelInfo, req: ServeRequest, *, return_tokens: bool = False
) -> tuple[Served, list[SparseVector]]:
    """``req`` (a dense request) served with the sparse head as a further output of its one forward: the
    served call (its rows the dense vectors) and each input's sparse vector."""
    req = replace(req, params=with_policy(request.app[CONFIG], req.params))  # both outputs tokenize alike
    sparse = sparse_request(info, req, return_tokens=return_tokens).params
    served = await serve(request, replace(req, params=replace(req.params, outputs=(sparse,))))
    (more,) = served.result.more
    return served, [sparse_vector(more.outputs, i, more.tokens) for i in range(len(more.outputs))]
