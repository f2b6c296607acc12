"""vLLM's tokenizer routes: ``POST /tokenize`` (a prompt, or chat messages) and ``POST /detokenize``.

The gateway answers both itself, with the model's own tokenizer (its
``Front``, ``shared.inputs.front``) in its tokenizer pool: no worker is asked.

- ``/tokenize``, completion form ``{model, prompt, add_special_tokens=true,
  return_token_strs=false}``, or chat form ``{model, messages,
  add_generation_prompt=true, continue_final_message=false,
  add_special_tokens=false, chat_template_kwargs, return_token_strs}``
  (vLLM's defaults for each form) → ``{count, max_model_len, tokens,
  token_strs}``; ``token_strs`` is null unless asked for. Prompts longer
  than the model are counted, not refused.
- ``/detokenize`` ``{model, tokens}`` → ``{prompt}``; ids outside the
  vocabulary are a 400.
"""

from __future__ import annotations

from typing import Annotated

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from poolgate.gateway.dialects.chat import ChatOptions, Conversation, text_chat
from poolgate.gateway.dialects.encoding import dumps
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.serving import chars, lookup
from poolgate.gateway.tokenizing import run_tokenizer
from poolgate.shared.domain.limits import check_inputs
from poolgate.shared.wire.messages import Input


class TokenizeRequest(ChatOptions):
    """Either form of vLLM's tokenize request; unknown fields are ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: StrictStr | None = None
    messages: Conversation | None = None
    add_special_tokens: bool | None = None  # None: the form's default (true for a prompt, false for chat)
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_form(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a tokenize request takes either `prompt` or `messages`")
        return self

    def input(self) -> Input:
        """``prompt``, or ``messages`` as one conversation (``_one_form`` checked that one of them is given)."""
        if self.messages is not None:
            return text_chat(self.messages, self)
        return self.prompt or ""

    def special_tokens(self) -> bool:
        return self.add_special_tokens if self.add_special_tokens is not None else self.messages is None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str | None] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[Annotated[StrictInt, Field(ge=0, lt=2**31)]]


class DetokenizeResponse(BaseModel):
    prompt: str


async def create_tokenize(request: web.Request, req: TokenizeRequest) -> web.Response:
    pools = lookup(request, req.model)
    x = req.input()
    check_inputs(pools.info, [x])  # the checks every route runs: valid Unicode, no empty conversation
    pools.check(1, chars(x))  # the request's own size limits, before its text is tokenized
    front = pools.front
    ids, strs = await run_tokenizer(
        request.app, lambda y: front.tokenize(y, req.special_tokens(), req.return_token_strs), x
    )
    body = {"count": len(ids), "max_model_len": pools.info.max_model_len, "tokens": ids, "token_strs": strs}
    return web.Response(body=dumps(body), content_type="application/json")


async def create_detokenize(request: web.Request, req: DetokenizeRequest) -> web.Response:
    pools = lookup(request, req.model)
    front = pools.front
    prompt = await run_tokenizer(request.app, lambda ids: front.detokenize(ids, False), req.tokens)
    return web.Response(body=dumps({"prompt": prompt}), content_type="application/json")


ROUTES = (
    Route(
        "POST",
        "/tokenize",
        create_tokenize,
        TokenizeRequest,
        TokenizeResponse,
        summary="Tokenize a prompt or chat messages with the model's tokenizer",
    ),
    Route(
        "POST",
        "/detokenize",
        create_detokenize,
        DetokenizeRequest,
        DetokenizeResponse,
        summary="Turn token ids back into text",
    ),
)
