"""vLLM's classification route: ``POST /classify`` (and ``/v1/classify``) and its pure conversions.

The body is vLLM's ``ClassificationRequest``: ``input`` (or chat-style
``messages``, rendered with the model's chat template), ``model``,
``truncate_prompt_tokens``, ``use_activation`` (False = the raw logits) and
``user``; like vLLM it has no ``dimensions`` or
``encoding_format``, so those are extra fields and ignored. Each item is the
model's probabilities (after its activation), the label of the largest one
(``null`` when the model names no labels) and the number of classes.
"""

from __future__ import annotations

import time

import numpy as np
from aiohttp import web
from pydantic import BaseModel

from poolgate.gateway.dialects.chat import CompletionOrChatBody
from poolgate.gateway.dialects.encoding import dumps, to_float_list
from poolgate.gateway.dialects.envelope import Usage, list_response
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.http.state import ROUTER
from poolgate.gateway.serving import Served, ServeRequest, record_answer, serve
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import ModelInfo

PATHS = ("/classify", "/v1/classify")


class ClassificationRequest(CompletionOrChatBody):
    """The body of ``POST /classify``; unknown fields are allowed and ignored."""


class ClassificationData(BaseModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(BaseModel):
    """vLLM's ClassificationResponse (documents the route)."""

    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: Usage


def to_request(req: ClassificationRequest, info: ModelInfo | None = None) -> ServeRequest:
    """The dialect-free request (``info``: the model's, for how its chats are read: ``dialects.chat``)."""
    inputs, special = req.call_inputs(info)
    params = PoolingParams(
        task="classify", use_activation=req.use_activation, add_special_tokens=special, **req.truncation()
    )
    return ServeRequest(model=req.model, inputs=inputs, params=params, priority=req.priority)


def to_response(served: Served, *, created: int) -> dict:
    """vLLM's ClassificationResponse; the call's (n, num_labels) block is split into items here."""
    rows, labels = served.result.outputs, served.info.labels
    data = []
    for i in range(len(rows)):
        probs = rows.item(i)  # (num_labels,)
        data.append(
            {"index": i, "label": label_of(probs, labels), "probs": to_float_list(probs), "num_classes": len(probs)}
        )
    return list_response("classify", served, data, created=created)


def label_of(probs: np.ndarray, labels: tuple[str, ...] | None) -> str | None:
    """The label of the largest output, as vLLM's ``id2label.get(argmax)``."""
    best = int(np.argmax(probs))
    return labels[best] if labels is not None and best < len(labels) else None


async def create_classify(request: web.Request, req: ClassificationRequest) -> web.Response:
    served = await serve(request, to_request(req, request.app[ROUTER].lookup(req.model).info))
    body = to_response(served, created=int(time.time()))
    record_answer(request, body["id"])
    return web.Response(body=dumps(body), content_type="application/json")


ROUTES = tuple(
    Route(
        "POST",
        path,
        create_classify,
        ClassificationRequest,
        ClassificationResponse,
        tasks=("classify",),
        summary="vLLM classification",
    )
    for path in PATHS
)
