"""text-embeddings-inference's tokenizer routes: TEI's ``POST /tokenize`` body and ``POST /decode``.

- ``/tokenize`` ``{inputs, add_special_tokens=true, prompt_name}`` (a text or
  a list of texts) → ``[[{id, text, special, start, stop}]]``: per input, each
  token's id; for a special token its token string, no offsets; otherwise its
  characters of the (prompted) input and their ``[start, stop)`` offsets.
  vLLM's ``/tokenize`` has the path too (``{prompt}`` / ``{messages}``): a body
  with ``inputs`` and neither of those is TEI's, and is answered as TEI's.
- ``/decode`` ``{ids, skip_special_tokens=true}`` (ids, or a list of them) →
  ``[text]``, one per id list.

The gateway answers both itself, with the model's own tokenizer (its
``Front``, ``shared.inputs.front``) in its tokenizer pool: no worker is asked.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict, RootModel, StrictStr

from poolgate.gateway.dialects.encoding import dumps
from poolgate.gateway.dialects.prompts import prompt_for
from poolgate.gateway.dialects.request import as_batch
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.dialects.tei_body import TokenIds
from poolgate.gateway.serving import Scope, lookup
from poolgate.gateway.tokenizing import run_tokenizer
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.limits import check_inputs


class TokenizeInputsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    inputs: StrictStr | list[StrictStr]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class DecodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    ids: TokenIds | list[TokenIds]
    skip_special_tokens: bool = True


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


TokenizeResponse = RootModel[list[list[SimpleToken]]]
DecodeResponse = RootModel[list[str]]


def simple_tokens(text: str, details: dict) -> list[dict]:
    """TEI's tokens of ``text`` from the worker's ids, token strings, offsets and special flags."""
    out = []
    for token_id, token, span, special in zip(
        details["tokens"], details["token_strs"], details["offsets"], details["special"], strict=True
    ):
        if special:
            out.append({"id": token_id, "text": token or "", "special": True, "start": None, "stop": None})
        else:
            out.append(
                {"id": token_id, "text": text[span[0] : span[1]], "special": False, "start": span[0], "stop": span[1]}
            )
    return out


async def tokenized(request: Scope, req: TokenizeInputsRequest) -> list[list[dict]]:
    """Each input's TEI tokens (the gRPC servicers call it too)."""
    pools = lookup(request, req.model)
    texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
    if not texts:
        raise InvalidRequest("`inputs` cannot be empty", param="inputs")
    prompt = prompt_for(pools.info, prompt_name=req.prompt_name) or ""  # as sentence-transformers' encode(prompt=)
    texts = [prompt + text for text in texts]
    check_inputs(pools.info, texts)  # the checks every route runs: valid Unicode

    pools.check(len(texts), max(map(len, texts)))  # the request's own size limits, before it is tokenized
    front = pools.front

    def one(text: str) -> list[dict]:
        return simple_tokens(text, front.token_details(text, req.add_special_tokens))

    return list(await run_tokenizer(request.app, lambda batch: [one(text) for text in batch], texts))


async def tokenize(request: web.Request, req: TokenizeInputsRequest) -> web.Response:
    return web.Response(body=dumps(await tokenized(request, req)), content_type="application/json")


async def decoded(request: Scope, req: DecodeRequest) -> list[str]:
    """Each id list's text (the gRPC servicers call it too)."""
    pools = lookup(request, req.model)
    batch = [ids for ids in as_batch(req.ids) if isinstance(ids, list)]  # one id list, or a batch of them

    front = pools.front
    texts = await run_tokenizer(
        request.app, lambda ids_batch: [front.detokenize(ids, req.skip_special_tokens) for ids in ids_batch], batch
    )
    return list(texts)


async def decode(request: web.Request, req: DecodeRequest) -> web.Response:
    return web.Response(body=dumps(await decoded(request, req)), content_type="application/json")


def _tei_tokenize_body(raw: object) -> bool:
    return isinstance(raw, dict) and "inputs" in raw and "prompt" not in raw and "messages" not in raw


ROUTES = (
    Route(
        "POST",
        "/tokenize",
        tokenize,
        TokenizeInputsRequest,
        TokenizeResponse,
        errors="tei",
        shape=_tei_tokenize_body,
        summary="TEI tokenize ({inputs}): each token's id, text and offsets",
    ),
    Route(
        "POST", "/decode", decode, DecodeRequest, DecodeResponse, errors="tei", summary="TEI: token ids back to text"
    ),
)
