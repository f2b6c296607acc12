"""text-embeddings-inference's embedding routes: /embed, /embed_all, /embed_sparse, /similarity, GET /info, POST /.

Field names, defaults and answers are TEI's, so its clients (``huggingface_hub``'s
``InferenceClient``, LlamaIndex's ``TextEmbeddingsInference``, Haystack's TEI
embedders) work unmodified; errors are TEI's ``{"error", "error_type"}``
(``http.errors.tei_error_body``) with poolgate's status codes. The shared fields
are in ``dialects.tei_body``; /predict and /rerank in ``dialects.tei_scores``;
/tokenize and /decode in ``dialects.tei_tokens``.

- ``POST /embed`` ``{inputs, normalize=true, truncate, truncation_direction,
  prompt_name, dimensions}`` → ``[[float]]``, one vector per input (a single
  input too); ``inputs``: a text, token ids, or a list of either.
- ``POST /embed_all`` (no ``normalize`` / ``dimensions``) → ``[[[float]]]``:
  each token's vector, unnormalized (models that serve ``token_embed``).
- ``POST /embed_sparse`` → ``[[{index, value}]]``: each input's sparse vector
  (token id → positive weight, ids ascending) from the worker's sparse output
  (``shared.domain.sparse``: SPLADE's vocabulary vector, BGE-M3's sparse weights).
- ``POST /similarity`` ``{inputs: {source_sentence, sentences}, parameters:
  {truncate, truncation_direction, prompt_name}}`` → ``[float]``: each
  sentence's cosine with the source sentence.
- ``GET /info`` (``?model=`` for one of several): the model id, dtype, kind
  (``embedding``, ``classifier`` with its labels, or ``reranker``) and limits;
  what the gateway cannot know (the worker's pooling and batch budget) is null.
  Beyond TEI's fields, ``kernels``: what each op runs on the worker and why
  not poolgate's own kernel (``/v1/models``' ``worker.kernels``).
- ``POST /``: what ``InferenceClient(base_url=...)`` posts: a similarity body
  goes to /similarity, a ``{query, texts}`` body to /rerank, else the model's
  kind picks /predict (a classifier) or /embed.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictStr

from poolgate.gateway.dialects import tei_scores
from poolgate.gateway.dialects.encoding import dumps
from poolgate.gateway.dialects.prompts import prompt_for
from poolgate.gateway.dialects.route import Route, serve_route
from poolgate.gateway.dialects.tei_body import InputsBody, TeiBody, prompted
from poolgate.gateway.http.state import CHOSEN, CONFIG, ROUTER
from poolgate.gateway.serving import Scope, Served, ServeRequest, serve
from poolgate.shared.domain.score_plan import scoring_enabled
from poolgate.shared.domain.scoring import cosine_scores
from poolgate.shared.domain.sparse import SPARSE_HEADS, SparseVector, sparse_head, sparse_vector
from poolgate.shared.domain.tasks import PoolingTask
from poolgate.shared.version import VERSION
from poolgate.shared.wire.messages import ModelInfo


class EmbedRequest(InputsBody):
    normalize: bool = True
    dimensions: Annotated[int, Field(ge=1)] | None = None


class EmbedAllRequest(InputsBody):
    """The body of /embed_all and /embed_sparse."""


class SimilarityInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source_sentence: StrictStr
    sentences: list[StrictStr] = Field(min_length=1)


class SimilarityParameters(TeiBody):
    prompt_name: str | None = None


class SimilarityRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class SparseValue(BaseModel):
    index: int
    value: float


EmbedResponse = RootModel[list[list[float]]]
EmbedAllResponse = RootModel[list[list[list[float]]]]
EmbedSparseResponse = RootModel[list[list[SparseValue]]]
SimilarityResponse = RootModel[list[float]]


def _json(body: Any) -> web.Response:
    return web.Response(body=dumps(body), content_type="application/json")


async def served(request: Scope, req: InputsBody, task: PoolingTask | None, **fields: Any) -> Served:
    """``req``'s inputs served with ``task`` (None: the model's sparse head's task, for a sparse call); the
    gRPC servicers (``gateway.grpc.tei``) call it too."""
    info = request.app[ROUTER].lookup(req.model).info
    params = req.params(task or sparse_head(info).task, **fields)
    return await serve(request, ServeRequest(model=req.model, inputs=req.batch(info), params=params))


def embed_fields(req: EmbedRequest) -> dict[str, Any]:
    """/embed's pooling fields beside the task."""
    return {"use_activation": req.normalize, "dimensions": req.dimensions}


async def _pooled(request: web.Request, req: InputsBody, task: PoolingTask, **fields: Any) -> list[np.ndarray]:
    rows = (await served(request, req, task, **fields)).result.outputs
    return [rows.item(i) for i in range(len(rows))]


async def embed(request: web.Request, req: EmbedRequest) -> web.Response:
    return _json(await _pooled(request, req, "embed", **embed_fields(req)))


async def embed_all(request: web.Request, req: EmbedAllRequest) -> web.Response:
    return _json(await _pooled(request, req, "token_embed", use_activation=False))  # (tokens, hidden) each


def sparse_values(vector: SparseVector) -> list[dict]:
    """TEI's ``[{index, value}]`` of one sparse vector (ids ascending)."""
    return [{"index": int(i), "value": float(v)} for i, v in zip(vector.indices, vector.values, strict=True)]


async def embed_sparse(request: web.Request, req: EmbedAllRequest) -> web.Response:
    rows = (await served(request, req, None, sparse=True)).result.outputs
    return _json([sparse_values(sparse_vector(rows, i)) for i in range(len(rows))])


def has_sparse_head(info: ModelInfo) -> bool:
    head = SPARSE_HEADS.get(info.architecture)
    return head is not None and head.task in info.tasks


async def similarity(request: web.Request, req: SimilarityRequest) -> web.Response:
    options = req.parameters or SimilarityParameters()
    info = request.app[ROUTER].lookup(req.model).info
    texts = prompted(
        [req.inputs.source_sentence, *req.inputs.sentences], prompt_for(info, prompt_name=options.prompt_name)
    )
    served = await serve(request, ServeRequest(model=req.model, inputs=texts, params=options.params("embed")))
    return _json(cosine_scores(served.result.outputs, 1))  # (sentences,)


def model_type(info: ModelInfo) -> dict:
    """TEI's ``model_type``: a one-label classifier is a reranker, another classifier a classifier."""
    if info.tasks and info.tasks[0] == "classify":
        labels = tei_scores.labels_of(info)
        kind = {
            "id2label": {str(i): label for i, label in enumerate(labels)},
            "label2id": {label: i for i, label in enumerate(labels)},
        }
        return {"reranker" if scoring_enabled(info) else "classifier": kind}
    return {"embedding": {"pooling": None}}


async def info_route(request: web.Request, _body: None = None) -> web.Response:
    info, config = request.app[ROUTER].lookup(request.query.get("model")).info, request.app[CONFIG]
    return _json(
        {
            "model_id": info.served_model_name,
            "model_sha": None,
            "model_dtype": info.dtype,
            "model_type": model_type(info),
            "max_concurrent_requests": config.max_in_flight_per_worker,
            "max_input_length": info.max_model_len,
            "max_batch_tokens": None,
            "max_batch_requests": None,
            "max_client_batch_size": config.max_inputs_per_request,
            "auto_truncate": config.auto_truncate,
            "tokenization_workers": None,
            "version": VERSION,
            "sha": None,
            "docker_label": None,
            "prompts": info.prompts,
            "kernels": info.kernels or {},
        }
    )


class AnyBody(RootModel[dict[str, Any]]):
    """Any JSON object: a body of /embed, /predict, /rerank or /similarity."""


def root_route(raw: dict, info: ModelInfo) -> Route:
    """The route ``POST /`` answers as (module doc)."""
    if isinstance(raw.get("inputs"), dict):
        return SIMILARITY
    if "query" in raw and "texts" in raw:
        return tei_scores.RERANK
    return tei_scores.PREDICT if info.tasks and info.tasks[0] == "classify" else EMBED


async def root(request: web.Request, body: AnyBody) -> web.StreamResponse:
    raw = body.root
    info = request.app[ROUTER].lookup(raw.get("model") if isinstance(raw.get("model"), str) else None).info
    chosen = request[CHOSEN] = root_route(raw, info)
    return await serve_route(request, chosen, raw)


EMBED = Route(
    "POST",
    "/embed",
    embed,
    EmbedRequest,
    EmbedResponse,
    tasks=("embed",),
    errors="tei",
    summary="TEI: one vector per input",
)
SIMILARITY = Route(
    "POST",
    "/similarity",
    similarity,
    SimilarityRequest,
    SimilarityResponse,
    tasks=("embed",),
    errors="tei",
    summary="TEI: cosine of each sentence with the source sentence",
)
ROUTES = (
    EMBED,
    Route(
        "POST",
        "/embed_all",
        embed_all,
        EmbedAllRequest,
        EmbedAllResponse,
        tasks=("token_embed",),
        errors="tei",
        summary="TEI: every token's vector",
    ),
    Route(
        "POST",
        "/embed_sparse",
        embed_sparse,
        EmbedAllRequest,
        EmbedSparseResponse,
        errors="tei",
        serves=has_sparse_head,
        operation="embed_sparse",
        summary="TEI: each input's sparse vector (SPLADE, BGE-M3's sparse weights)",
    ),
    SIMILARITY,
    Route("GET", "/info", info_route, errors="tei", summary="TEI: the model and the server's limits"),
    Route(
        "POST",
        "/",
        root,
        AnyBody,
        errors="tei",
        summary="TEI's compat route (InferenceClient): similarity, rerank, predict or embed by body and model",
    ),
)
