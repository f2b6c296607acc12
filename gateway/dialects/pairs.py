"""Scoring query/document pairs through the serving path, with the scorer the model's active task implies.

``/score`` and the rerank routes share this: their request base (``ScoringBody``:
vLLM's common fields plus ``use_activation``, ``max_tokens_per_query``,
``max_tokens_per_doc``, ``instruction``, ``chat_template_kwargs``) and
``score_pairs``, which reads the body's texts and sends ONE call made by the
score plan (``shared.domain.score_plan``, which the offline API uses too): pairs as
vLLM makes them (1:1, 1:N, N:N), for the scorer of the model's active task:

- cross-encoder (``classify``, one label): one ``TextPair`` per pair, read as
  one sequence by the worker (the model's score template with the request's
  ``instruction``, else its tokenizer's pair template, BERT token type ids);
- bi-encoder (``embed``) and late interaction (``token_embed``): each query
  and each document pooled once, then cosine / MaxSim here in numpy
  (``shared.domain.scoring``), the query vectors reused for every document.

Each side's item is a text, Jina's ``{"text"}`` or ``{"image"}``, or vLLM's
``{"content": [parts]}`` (``dialects.media_parts``: text and images in order,
ONE input); one holding an image is a ``MediaInput`` with its role
(``query`` / ``document``), a content list of text only its text. The plan
carries images through every scorer (a cross-encoder's pair with an image is
one ``MediaInput`` with role ``pair``, ``shared.domain.score_plan``); the
rerank answer echoes such a document as ``{multi_modal: [parts]}``, as vLLM.

``max_tokens_per_*`` cut each side to that many content tokens before the
special tokens (``TextPair`` / ``CappedText`` caps, applied in the worker);
they must be below ``max_model_len``. Usage is the call's prompt tokens: per
pair for a cross-encoder, each query and document once otherwise (vLLM's count).

poolgate's long-document fields: ``max_chunks_per_doc`` (at least 1) reads
each document in up to that many token windows, ``chunk_overlap`` tokens
shared by consecutive windows, folded by ``chunk_aggregation`` (``max``, the
default, or ``mean``); every window's tokens count in usage, and each result
names its best window as ``best_chunk: {index, start, end}`` (characters of
the document). Without ``max_chunks_per_doc`` nothing changes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from poolgate.gateway.dialects.media_parts import IMAGE_URL, ContentPart, has_media, part_of
from poolgate.gateway.dialects.request import reject_removed
from poolgate.gateway.http.state import ROUTER
from poolgate.gateway.serving import Scope, Served, ServeRequest, serve
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.score_plan import SideCaps, WindowSpec, plan_scores
from poolgate.shared.domain.scoring import check_pairs, query_of
from poolgate.shared.inputs.media.clip import dual_scores
from poolgate.shared.wire.media import MediaInput
from poolgate.shared.wire.messages import Input


class ContentInput(BaseModel):
    """vLLM's multimodal score input, ``{"content": [parts]}``: one input of text and image parts in order
    (``dialects.media_parts``)."""

    model_config = ConfigDict(extra="allow")
    content: list[ContentPart]


class TextObject(BaseModel):
    """Jina's document object, ``{"text": ...}``."""

    model_config = ConfigDict(extra="allow")
    text: StrictStr


class ImageObject(BaseModel):
    """Jina's image document, ``{"image": <URL, data URL or bare base64>}``."""

    model_config = ConfigDict(extra="allow")
    image: StrictStr


ScoreInput = StrictStr | TextObject | ImageObject | ContentInput
ScoreInputs = ScoreInput | list[ScoreInput]


class ScoringBody(BaseModel):
    """The fields /score and /rerank share (vLLM's ScoreRequestMixin); unknown fields are ignored, the
    names vLLM removed are refused as on every pooling route."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    use_activation: bool | None = None
    max_tokens_per_query: Annotated[int, Field(ge=0)] = 0
    max_tokens_per_doc: Annotated[int, Field(ge=0)] = 0
    max_chunks_per_doc: int | None = None  # poolgate: long documents in windows (Cohere v1's name)
    chunk_overlap: int = 0  # tokens consecutive windows share
    chunk_aggregation: str = "max"  # how window scores fold: "max" or "mean"
    priority: int | None = None  # vLLM's (and Cohere's): lower runs earlier; None: the tenant's default (else 0)
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _reject_removed(cls, data: Any) -> Any:
        return reject_removed(data)

    def window_spec(self) -> WindowSpec | None:
        """The long-document windows asked for (None: vLLM's behaviour, a document over the limit is a 400)."""
        if self.max_chunks_per_doc is None:
            return None
        return WindowSpec(self.max_chunks_per_doc, self.chunk_overlap, self.chunk_aggregation)

    def instruction_text(self) -> str | None:
        """``instruction``, else ``chat_template_kwargs`` ``instruction`` / ``instruct`` (vLLM merges them)."""
        kwargs = self.chat_template_kwargs or {}
        value = self.instruction or kwargs.get("instruction") or kwargs.get("instruct")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Scored:
    """One score per (query, document) pair, in document order, and how the call was served."""

    scores: np.ndarray  # (pairs,) float32
    served: Served
    best: list[tuple[int, int, int]] | None = None  # with windows: each document's best (window, start, end)

    def best_chunk(self, i: int) -> dict | None:
        """Document ``i``'s best window for the response (None without windows)."""
        if self.best is None:
            return None
        k, start, end = self.best[i]
        return {"index": k, "start": start, "end": end}


def as_input(item: ScoreInput, role: str, where: str) -> Input:
    """One side's input: a text, or a ``MediaInput`` with ``role`` (query, document) when it holds an image;
    a content list of text parts only is its text (its parts joined by newlines)."""
    if isinstance(item, str):
        return item
    if isinstance(item, TextObject):
        return item.text
    if isinstance(item, ImageObject):
        return MediaInput(parts=(part_of(ContentPart(type=IMAGE_URL, image_url=item.image), where),), role=role)
    if not item.content:
        raise InvalidRequest(f"{where}: a content list needs at least one part", param=where)
    parts = [part_of(p, f"{where}.content[{j}]") for j, p in enumerate(item.content)]
    if not has_media(parts):
        return "\n".join(p for p in parts if isinstance(p, str))
    return MediaInput(parts=tuple(parts), role=role)


def echo(item: ScoreInput) -> dict[str, Any]:
    """A document as the rerank answer echoes it (vLLM's): ``{text}``, or ``{multi_modal: [parts]}``."""
    if isinstance(item, str):
        return {"text": item, "multi_modal": None}
    if isinstance(item, TextObject):
        return {"text": item.text, "multi_modal": None}
    if isinstance(item, ImageObject):
        return {"text": None, "multi_modal": [{"type": IMAGE_URL, "image_url": {"url": item.image}}]}
    return {"text": None, "multi_modal": [p.model_dump(exclude_none=True) for p in item.content]}


INPUT_INDEX = re.compile(r"^input\[(\d+)\]")


def side_named(exc: InvalidRequest, kind: str, n_queries: int) -> InvalidRequest:
    """``exc`` with the call's ``input[k]`` named as the request's ``queries[i]`` or ``documents[j]``: a
    cross-encoder's call holds one input per document (its pair), the others the queries then the documents."""
    found = INPUT_INDEX.match(exc.message)
    if found is None:
        return exc
    k = int(found.group(1))
    name = (
        f"documents[{k}]"
        if kind == "cross-encoder"
        else (f"queries[{k}]" if k < n_queries else f"documents[{k - n_queries}]")
    )
    renamed = type(exc)(name + exc.message[found.end() :], param=name)
    return renamed


def as_list(value: ScoreInput | Sequence[ScoreInput]) -> list[ScoreInput]:
    return [value] if isinstance(value, str | TextObject | ImageObject | ContentInput) else list(value)


async def score_pairs(
    request: Scope,
    body: ScoringBody,
    queries: ScoreInput | Sequence[ScoreInput],
    documents: ScoreInput | Sequence[ScoreInput],
) -> Scored:
    """Score every (query, document) pair of ``body`` with the model's own scorer, in one call."""
    info = request.app[ROUTER].lookup(body.model).info
    qs, ds = as_list(queries), as_list(documents)
    check_pairs(len(qs), len(ds))  # before the texts are read: vLLM's order of messages
    side_q = [as_input(x, "query", f"queries[{i}]") for i, x in enumerate(qs)]
    side_d = [as_input(x, "document", f"documents[{i}]") for i, x in enumerate(ds)]
    plan = plan_scores(
        info,
        side_q,
        side_d,
        SideCaps(body.max_tokens_per_query, body.max_tokens_per_doc),
        body.instruction_text(),
        body.window_spec(),
    )
    media = getattr(request.app[ROUTER].lookup(body.model).front.encoder.files, "media", None) or {}
    dual = media.get("plan") == "clip" and plan.kind == "bi-encoder"  # its logits apply (shared.inputs.media.clip)
    activation = None if dual else body.use_activation  # a dual encoder's vectors stay normalized: cosines first
    params = plan.params(use_activation=activation, truncate_prompt_tokens=body.truncate_prompt_tokens)
    try:
        served = await serve(
            request, ServeRequest(model=body.model, inputs=plan.inputs, params=params, priority=body.priority)
        )
    except InvalidRequest as exc:  # "input[k]: ..." of the call: named as the request's side instead
        raise side_named(exc, plan.kind, len(qs)) from None
    scores = plan.scores(served.result.outputs, served.result.windows)
    values = scores.values
    if dual and body.use_activation is not None:  # logits or their trained activation, as asked
        values = dual_scores(media, values, query_of(len(qs), len(ds)), body.use_activation)
    return Scored(values, served, scores.best)
