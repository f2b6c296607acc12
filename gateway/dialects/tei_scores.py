"""text-embeddings-inference's scoring routes: ``POST /predict`` (classifiers) and TEI's ``POST /rerank`` body.

- ``/predict`` ``{inputs, truncate, truncation_direction, raw_scores=false}``:
  ``inputs`` is a text, a pair ``[text, text_pair]``, or a batch of either
  (``[[text], [text, text_pair], ...]``); a pair is read as one sequence, as
  a cross-encoder does. Each input answers every label as ``{score, label}``,
  highest first (a single input: one list; a batch: a list of lists);
  ``raw_scores`` true gives the logits instead of the model's activation.
  Labels are the model's ``id2label``, else ``LABEL_i``. ``parameters``
  (``huggingface_hub``'s ``text_classification`` sends it): ``top_k`` keeps
  the best k labels, ``function_to_apply: "none"`` gives the logits.
- ``/rerank`` ``{query, texts, truncate, truncation_direction, raw_scores,
  return_text}`` → ``[{index, score, text?}]``, highest first. vLLM's
  ``/rerank`` has the path too (``{query, documents}``): a body with ``texts``
  and no ``documents`` is TEI's (``shape``), and each answers as its own
  dialect. Scores come from the model's scorer (``dialects.pairs``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictStr, field_validator

from poolgate.gateway.dialects.encoding import dumps
from poolgate.gateway.dialects.pairs import ScoringBody, score_pairs
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.dialects.tei_body import TeiBody
from poolgate.gateway.serving import Scope, Served, ServeRequest, serve
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.score_plan import scoring_enabled
from poolgate.shared.wire.messages import ModelInfo, TextPair

Sequence = list[StrictStr]  # [text] or [text, text_pair]


class PredictParameters(BaseModel):
    """What ``InferenceClient.text_classification`` adds: ``top_k`` cuts the labels; ``function_to_apply``
    can only be ``none`` (the logits, as ``raw_scores``): the model's own activation is the other choice."""

    model_config = ConfigDict(extra="forbid")
    function_to_apply: Literal["none"] | None = None
    top_k: Annotated[int, Field(ge=1)] | None = None


class PredictRequest(TeiBody):
    inputs: StrictStr | Sequence | list[Sequence]
    raw_scores: bool = False
    parameters: PredictParameters | None = None

    @field_validator("inputs")
    @classmethod
    def _sizes(cls, value: Any) -> Any:
        batch = value if value and isinstance(value[0], list) else [value] if isinstance(value, list) else []
        if not value or any(len(seq) not in (1, 2) for seq in batch):
            raise ValueError(
                "a string, a pair of strings [string, string] or a batch of mixed strings and pairs "
                "[[string], [string, string], ...]"
            )
        return value

    def batch(self) -> tuple[list, bool]:
        """The call inputs and whether the body was a batch."""
        single = isinstance(self.inputs, str) or isinstance(self.inputs[0], str)
        items = cast(list[str | list[str]], [self.inputs] if single else self.inputs)  # shapes: ``_sizes``
        return [
            seq if isinstance(seq, str) else seq[0] if len(seq) == 1 else TextPair(seq[0], seq[1]) for seq in items
        ], not single


class Prediction(BaseModel):
    score: float
    label: str


class RerankTextsRequest(TeiBody):
    query: StrictStr
    texts: list[StrictStr]
    raw_scores: bool = False
    return_text: bool = False


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None


PredictResponse = RootModel[list[Prediction] | list[list[Prediction]]]
RerankResponse = RootModel[list[Rank]]


def labels_of(info: ModelInfo) -> list[str]:
    return list(info.labels) if info.labels else [f"LABEL_{i}" for i in range(info.embedding_dim)]


def predictions(scores: np.ndarray, labels: list[str]) -> list[dict]:
    """Every label's score, highest first."""
    order = np.argsort(-scores, kind="stable")
    return [{"score": float(scores[i]), "label": labels[i] if i < len(labels) else f"LABEL_{i}"} for i in order]


async def predicted(request: Scope, req: PredictRequest) -> tuple[list[list[dict]], Served]:
    """Each input's ``[{score, label}]``, highest first, and what served them (the gRPC servicers call it too)."""
    inputs, _ = req.batch()
    options = req.parameters or PredictParameters()
    raw = req.raw_scores or options.function_to_apply == "none"
    params = req.params("classify", use_activation=False if raw else None)
    served = await serve(request, ServeRequest(model=req.model, inputs=inputs, params=params))
    rows, labels = served.result.outputs, labels_of(served.info)
    answers = [
        predictions(rows.item(i).astype(np.float32).reshape(-1), labels)[: options.top_k] for i in range(len(rows))
    ]
    return answers, served


async def predict(request: web.Request, req: PredictRequest) -> web.Response:
    answers, _ = await predicted(request, req)
    is_batch = req.batch()[1]
    return web.Response(body=dumps(answers if is_batch else answers[0]), content_type="application/json")


async def ranked(request: Scope, req: RerankTextsRequest) -> tuple[list[dict], Served]:
    """TEI's ``[{index, score, text?}]``, highest first, and what served them (the gRPC servicers call it too)."""
    if req.truncation_direction.lower() != "right":
        raise InvalidRequest(
            "truncation_direction left is not supported on /rerank: pairs are cut from the document's end",
            param="truncation_direction",
        )
    body = ScoringBody(
        model=req.model,
        truncate_prompt_tokens=-1 if req.truncate else None,
        use_activation=False if req.raw_scores else None,
    )
    scored = await score_pairs(request, body, req.query, req.texts)
    order = np.argsort(-scored.scores, kind="stable")
    ranks = [
        {"index": int(i), "score": float(scored.scores[i]), **({"text": req.texts[i]} if req.return_text else {})}
        for i in order
    ]
    return ranks, scored.served


async def rerank(request: web.Request, req: RerankTextsRequest) -> web.Response:
    ranks, _ = await ranked(request, req)
    return web.Response(body=dumps(ranks), content_type="application/json")


def _tei_rerank_body(raw: object) -> bool:
    return isinstance(raw, dict) and "texts" in raw and "documents" not in raw


PREDICT = Route(
    "POST",
    "/predict",
    predict,
    PredictRequest,
    PredictResponse,
    tasks=("classify",),
    errors="tei",
    summary="TEI: every label's score for texts or pairs",
)
RERANK = Route(
    "POST",
    "/rerank",
    rerank,
    RerankTextsRequest,
    RerankResponse,
    serves=scoring_enabled,
    operation="rerank",
    errors="tei",
    shape=_tei_rerank_body,
    summary="TEI rerank ({query, texts}): texts by relevance to the query",
)
ROUTES = (PREDICT, RERANK)
