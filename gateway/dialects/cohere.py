"""The Cohere dialect: ``POST /v2/embed`` (and ``/v1/embed``) and their pure conversions.

The body is vLLM's ``CohereEmbedRequest``: exactly one non-empty list of
``texts``, ``images`` (data URIs, or bare base64; one vector each) or v4's
``inputs`` (``{content: [{type: "text", text} | {type: "image_url",
image_url: {url}}]}``: the parts of one input in order, one vector each);
at most 96 images or inputs (Cohere's limit; ``dialects.cohere_media``). An
input with an image is a ``MediaInput`` (``search_query`` / ``search_document``
name its role); a model that reads text only answers it 400. An input of
text items only is their text joined by spaces, as before. The answer to
``images`` lists each image's ``{width, height, format, bit_depth}`` read
from its header (``images`` is empty otherwise). ``input_type`` picks the model's prompt
(``dialects.prompts``: a prompt name, or one of Cohere's four standard types
mapped onto the usual names, which a model without such a prompt accepts and
applies no prompt for), which is a system turn when the tokenizer has a chat
template and a text prefix otherwise; ``truncate`` END / START keeps the first / last ``max_tokens``
(at most, and by default, the model's maximum) and NONE refuses an input over ``max_tokens``;
``output_dimension`` is the Matryoshka ``dimensions``; ``embedding_types``
(default float) are computed as ``dialects.quantize`` documents, and
poolgate's ``sparse`` answers ``{indices, values}`` per text from the model's
sparse head (SPLADE, BGE-M3: ``dialects.sparse_serving``; 400 for other models); ``priority``
(lower runs earlier, default 0) is the call's scheduling priority. Errors are
Cohere's ``{"message": ...}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from aiohttp import web
from pydantic import BaseModel, Field, StrictStr

from poolgate.gateway.dialects.cohere_media import IMAGE_TYPE, CohereInput, image_meta, inputs_of, with_prompt
from poolgate.gateway.dialects.encoding import dumps
from poolgate.gateway.dialects.envelope import EMBEDDINGS, response_id
from poolgate.gateway.dialects.prompts import prompt_for
from poolgate.gateway.dialects.quantize import EMBEDDING_TYPES
from poolgate.gateway.dialects.route import AsksEncodings, Route
from poolgate.gateway.dialects.sparse_serving import serve_dense_and_sparse, serve_sparse
from poolgate.gateway.http.state import ROUTER
from poolgate.gateway.serving import Served, ServeRequest, record_answer, serve
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.limits import input_cap
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.sparse import SparseVector
from poolgate.shared.wire.messages import ChatInput, Input, ModelInfo

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64", "sparse"]
SPARSE = "sparse"  # poolgate's: {indices, values} from the model's sparse head (dialects.sparse_serving)


class CohereEmbedRequest(AsksEncodings):
    """The body of ``POST /v2/embed``; unknown fields are ignored."""

    model: str | None = None
    input_type: str | None = None
    texts: list[StrictStr] | None = None
    images: list[StrictStr] | None = None
    inputs: list[CohereInput] | None = None
    output_dimension: int | None = None
    embedding_types: list[EmbeddingType] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    priority: int | None = None  # None: the tenant's default (else 0)
    task: str | None = None  # poolgate (Jina's field): the task adapter the forward runs with (ModelInfo.adapters)

    @property
    def encoding_formats(self) -> tuple[str, ...]:
        """The embedding types asked (float by default, v1's ``embeddings_floats`` too)."""
        return tuple(self.embedding_types or ("float",))


class CohereEmbedResponse(BaseModel):
    id: str
    embeddings: dict[str, list] | list
    texts: list[str]
    images: list[dict]  # with images: each one's width, height, format, bit_depth; else empty
    meta: dict
    response_type: str


def prompted(inputs: list[Input], input_type: str | None, info: ModelInfo) -> tuple[list[Input], bool]:
    """The inputs with the ``input_type`` prompt applied (``dialects.prompts``: Cohere's standard types
    always accepted; ``image`` applies none), and whether they are chats (vLLM's rule). A text becomes a
    system turn and the text when the model has a chat template, else the prompt and the text; a
    ``MediaInput`` gets the prompt as its first text part."""
    prompt = None if input_type == IMAGE_TYPE else prompt_for(info, input_type)
    if not prompt:
        return list(inputs), False
    if info.chat_template and all(isinstance(x, str) for x in inputs):
        return [
            ChatInput(messages=[{"role": "system", "content": prompt}, {"role": "user", "content": x}])
            for x in inputs
            if isinstance(x, str)
        ], True
    return [with_prompt(x, prompt) for x in inputs], False


def to_request(req: CohereEmbedRequest, info: ModelInfo) -> tuple[ServeRequest, list[str]]:
    """The dialect-free request, and the texts to echo."""
    inputs, texts = inputs_of(req)
    inputs, chat = prompted(inputs, req.input_type, info)
    k = None if req.truncate == "NONE" else _keep(req.max_tokens, input_cap(info, "embed"))
    params = PoolingParams(
        task="embed",
        dimensions=req.output_dimension,
        truncate_prompt_tokens=k,
        truncation_side="left" if req.truncate == "START" else "right",
        add_special_tokens=not chat,
        adapter=req.task,
    )
    return ServeRequest(model=req.model, inputs=inputs, params=params, priority=req.priority), texts


def _keep(max_tokens: int | None, cap: int | None) -> int:
    """Tokens END / START keep: ``max_tokens``, at most the model's input cap (-1 = the cap itself)."""
    if max_tokens is None or (cap is not None and max_tokens >= cap):
        return -1
    return max_tokens


def check_max_tokens(req: CohereEmbedRequest, prompt_tokens: list[int]) -> None:
    """truncate=NONE: an input over ``max_tokens`` is refused (counted untruncated by the worker)."""
    if req.truncate == "NONE" and req.max_tokens is not None:
        for n in prompt_tokens:
            if n > req.max_tokens:
                raise InvalidRequest(
                    f"Input of {n} tokens exceeds max_tokens={req.max_tokens} with truncate=NONE. "
                    "Set truncate to END or START to allow truncation.",
                    param="max_tokens",
                )


def to_response(
    served: Served,
    texts: list[str],
    types: Sequence[str] | None,
    *,
    version: str = "2",
    sparse: list[SparseVector] | None = None,
) -> dict:
    """The embed response; ``types`` None (v1 only) answers v1's ``embeddings_floats``; ``sparse``: the
    sparse vectors when ``types`` holds "sparse" (``served`` is then the dense call, if any was made)."""
    rows = [served.result.outputs.item(i) for i in range(len(served.result.outputs))]
    meta = {"api_version": {"version": version}, "billed_units": {"input_tokens": served.result.total_tokens}}
    body = {"id": response_id(EMBEDDINGS, served), "texts": texts, "meta": meta}
    if types is None:
        return {**body, "embeddings": [EMBEDDING_TYPES["float"](r) for r in rows], "response_type": "embeddings_floats"}
    if SPARSE in types and sparse is None:
        raise ValueError("sparse embeddings were asked for but not computed")
    embeddings = {
        t: [v.to_json() for v in sparse or ()] if t == SPARSE else [EMBEDDING_TYPES[t](r) for r in rows]
        for t in dict.fromkeys(types)
    }
    return {**body, "embeddings": embeddings, "response_type": "embeddings_by_type"}


async def _embed(request: web.Request, req: CohereEmbedRequest, version: str) -> web.Response:
    types = req.embedding_types or (["float"] if version == "2" else None)
    info = request.app[ROUTER].lookup(req.model).info
    call, texts = to_request(req, info)
    dense, sparse = types is None or any(t != SPARSE for t in types), None
    if types and SPARSE in types:  # with a dense type too: one call, one forward (dialects.sparse_serving)
        served, sparse = await (serve_dense_and_sparse if dense else serve_sparse)(request, info, call)
    else:
        served = await serve(request, call)
    check_max_tokens(req, served.result.prompt_tokens)
    body = to_response(served, texts, types, version=version, sparse=sparse)
    meta = [image_meta(x) for x in req.images or ()]
    body["images"] = meta if None not in meta else []  # (none for an http(s) image: its bytes are not kept)
    record_answer(request, body["id"], served.result.outputs if dense else None)
    return web.Response(body=dumps(body), content_type="application/json")


async def embed_v2(request: web.Request, req: CohereEmbedRequest) -> web.Response:
    return await _embed(request, req, "2")


async def embed_v1(request: web.Request, req: CohereEmbedRequest) -> web.Response:
    return await _embed(request, req, "1")


ROUTES = (
    Route(
        "POST",
        "/v2/embed",
        embed_v2,
        CohereEmbedRequest,
        CohereEmbedResponse,
        tasks=("embed",),
        errors="cohere",
        summary="Cohere embed (v2)",
    ),
    Route(
        "POST",
        "/v1/embed",
        embed_v1,
        CohereEmbedRequest,
        CohereEmbedResponse,
        tasks=("embed",),
        errors="cohere",
        summary="Cohere embed (v1; embeddings_floats without embedding_types)",
    ),
)
