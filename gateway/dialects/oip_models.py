"""The Open Inference Protocol's view of a served model: its tensors by kind, run through the serving path.

REST (``dialects.oip``) and gRPC (``gateway.grpc``) both call ``infer``,
``model_metadata`` and ``model_config``; only the transport differs. A
model's kind is its active task's (``kind_of``), and each kind names its
tensors (``BYTES`` texts are UTF-8; an input of shape ``[N]`` may also come as
``[N, 1]``):

===========  ==================================  ==============================================
kind         inputs                              outputs
===========  ==================================  ==============================================
embedding    ``text`` BYTES [N]                  ``embeddings`` FP32 [N, D]
reranker     ``query`` BYTES [1],                ``scores`` FP32 [N], in document order
             ``documents`` BYTES [N]
classifier   ``text`` BYTES [N]                  ``probabilities`` FP32 [N, L], ``labels`` BYTES [N]
===========  ==================================  ==============================================

An embedding model is one whose active task is ``embed``; a reranker is a
one-label classifier (a cross-encoder: ``/rerank``'s ``relevance_score``) or
a late-interaction model (MaxSim); a classifier has several labels
(``labels``: the top label's name, the model's ``id2label`` else ``LABEL_i``).
Other models have no tensors here (their metadata lists none; an inference
is a 400). The parameters each kind takes are in ``dialects.oip_parameters``.
Every model has one version, ``"1"``: a request naming another (not ``""``)
is a 404 as for an unknown model.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from poolgate.gateway.dialects.oip_parameters import (
    ClassifyOptions,
    EmbedOptions,
    Options,
    ScoreOptions,
    merged,
    options,
)
from poolgate.gateway.dialects.oip_tensors import Tensor, tensor
from poolgate.gateway.dialects.pairs import ScoringBody, score_pairs
from poolgate.gateway.dialects.prompts import prompt_for, prompted
from poolgate.gateway.dialects.rerank import check_documents
from poolgate.gateway.dialects.tei_scores import labels_of
from poolgate.gateway.http.state import CONFIG, ROUTER
from poolgate.gateway.serving import Scope, ServeRequest, record_answer, serve
from poolgate.shared.domain.errors import InvalidRequest, ModelNotFound
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import Input, ModelInfo

VERSION = "1"
PLATFORM = "poolgate"
TRITON_TYPES = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32"}  # model_config's names of the datatypes used here


@dataclass(frozen=True)
class Spec:
    """One tensor a model takes or answers: its name, datatype and shape (-1: any size)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


Run = Callable[[Scope, ModelInfo, dict[str, Tensor], Any], Awaitable[list[Tensor]]]


@dataclass(frozen=True)
class Kind:
    """A kind of model: its input tensors, its output tensors (per model), its parameters and how it runs."""

    name: str
    inputs: tuple[Spec, ...]
    outputs: Callable[[ModelInfo], tuple[Spec, ...]]
    options: type[Options]
    run: Run


def texts(t: Tensor, *, one: bool = False) -> list[str]:
    """A BYTES input of shape [N] or [N, 1] (``one``: [1] or [1, 1]) as texts; 400 naming it otherwise."""
    flat_ok = len(t.shape) == 1 or (len(t.shape) == 2 and t.shape[1] == 1)
    if t.datatype != "BYTES" or not flat_ok or (one and t.shape[0] != 1):
        want = "[1] or [1, 1]" if one else "[N] or [N, 1]"
        raise InvalidRequest(
            f"input '{t.name}' is BYTES of shape {want}, got {t.datatype} {list(t.shape)}", param=t.name
        )
    if t.shape[0] == 0:
        raise InvalidRequest(f"input '{t.name}' is empty", param=t.name)
    try:
        return [bytes(v).decode("utf-8") for v in np.ravel(t.data)]
    except UnicodeDecodeError:
        raise InvalidRequest(f"input '{t.name}' is not UTF-8 text", param=t.name) from None


async def _embed(scope: Scope, info: ModelInfo, inputs: dict[str, Tensor], opts: EmbedOptions) -> list[Tensor]:
    batch: list[Input] = list(texts(inputs["text"]))
    batch = prompted(batch, prompt_for(info, opts.input_type, opts.prompt_name))
    params = PoolingParams(
        task="embed",
        use_activation=opts.normalize,
        dimensions=opts.dimensions,
        truncate_prompt_tokens=opts.truncation(),
        truncation_side=opts.truncation_direction,
    )
    request = ServeRequest(info.served_model_name, batch, params, priority=opts.call_priority())
    served = await serve(scope, request)
    rows = served.result.outputs
    record_answer(scope, served.request_id, rows)
    vectors = np.stack([rows.item(i) for i in range(len(rows))]) if rows.offsets is not None else rows.values
    return [tensor("embeddings", "FP32", vectors)]  # (N, D)


async def _rerank(scope: Scope, info: ModelInfo, inputs: dict[str, Tensor], opts: ScoreOptions) -> list[Tensor]:
    query, documents = texts(inputs["query"], one=True)[0], texts(inputs["documents"])
    check_documents(scope.app[CONFIG], len(documents))
    body = ScoringBody(
        model=info.served_model_name,
        truncate_prompt_tokens=opts.truncation(),
        use_activation=False if opts.raw_scores else None,
        priority=opts.call_priority(),
    )
    scored = await score_pairs(scope, body, query, documents)
    record_answer(scope, scored.served.request_id)
    return [tensor("scores", "FP32", scored.scores)]  # (N,)


async def _classify(scope: Scope, info: ModelInfo, inputs: dict[str, Tensor], opts: ClassifyOptions) -> list[Tensor]:
    params = PoolingParams(
        task="classify",
        use_activation=False if opts.raw_scores else None,
        truncate_prompt_tokens=opts.truncation(),
        truncation_side=opts.truncation_direction,
    )
    request = ServeRequest(info.served_model_name, list(texts(inputs["text"])), params, priority=opts.call_priority())
    served = await serve(scope, request)
    rows = served.result.outputs
    record_answer(scope, served.request_id)
    probs = np.stack([np.ravel(rows.item(i)) for i in range(len(rows))])  # (N, L)
    names = labels_of(info)
    top = [names[i] if i < len(names) else f"LABEL_{i}" for i in np.argmax(probs, axis=1)]
    return [tensor("probabilities", "FP32", probs), tensor("labels", "BYTES", top)]


def _embeddings(info: ModelInfo) -> tuple[Spec, ...]:
    return (Spec("embeddings", "FP32", (-1, -1 if info.is_matryoshka else info.embedding_dim)),)


def _labels(info: ModelInfo) -> tuple[Spec, ...]:
    n = len(info.labels) if info.labels else info.embedding_dim
    return Spec("probabilities", "FP32", (-1, n)), Spec("labels", "BYTES", (-1,))


TEXT = Spec("text", "BYTES", (-1,))
KINDS: dict[str, Kind] = {
    "embedding": Kind("embedding", (TEXT,), _embeddings, EmbedOptions, _embed),
    "reranker": Kind(
        "reranker",
        (Spec("query", "BYTES", (1,)), Spec("documents", "BYTES", (-1,))),
        lambda info: (Spec("scores", "FP32", (-1,)),),
        ScoreOptions,
        _rerank,
    ),
    "classifier": Kind("classifier", (TEXT,), _labels, ClassifyOptions, _classify),
}
BY_TASK = {"embed": "embedding", "token_embed": "reranker"}  # classify: by its labels (kind_of)


def kind_of(info: ModelInfo) -> Kind | None:
    """The model's kind by its active task (module doc); None for a model with no tensors here."""
    task = info.tasks[0] if info.tasks else None
    if task == "classify":
        return KINDS["reranker" if info.embedding_dim == 1 else "classifier"]
    name = BY_TASK.get(task) if task is not None else None
    return KINDS[name] if name is not None else None


def lookup(scope: Scope, model: str, version: str | None) -> ModelInfo:
    """The served ``model`` at ``version`` ("" / None / "1"); 404 for another model or version."""
    if not model:
        raise InvalidRequest("a model name is required", param="model")
    info = scope.app[ROUTER].lookup(model).info
    if version not in (None, "", VERSION):
        raise ModelNotFound(f"The model `{model}` has no version `{version}`: its one version is 1.", param="model")
    return info


def model_metadata(info: ModelInfo) -> dict[str, Any]:
    """The protocol's model metadata: name, versions, platform, input and output tensors."""
    kind = kind_of(info)
    return {
        "name": info.served_model_name,
        "versions": [VERSION],
        "platform": PLATFORM,
        "inputs": [s.as_dict() for s in kind.inputs] if kind else [],
        "outputs": [s.as_dict() for s in kind.outputs(info)] if kind else [],
    }


def model_config(info: ModelInfo) -> dict[str, Any]:
    """A small Triton model configuration (what ``get_model_config`` reads): no implicit batch dimension
    (``max_batch_size`` 0), each tensor's full shape in ``dims``."""
    meta = model_metadata(info)

    def entries(specs: list[dict]) -> list[dict]:
        return [{"name": s["name"], "data_type": TRITON_TYPES[s["datatype"]], "dims": s["shape"]} for s in specs]

    return {
        "name": meta["name"],
        "platform": PLATFORM,
        "backend": PLATFORM,
        "max_batch_size": 0,
        "input": entries(meta["inputs"]),
        "output": entries(meta["outputs"]),
    }


def _by_name(kind: Kind, info: ModelInfo, inputs: list[Tensor]) -> dict[str, Tensor]:
    """The inputs by name: each of the kind's exactly once, no other."""
    by_name: dict[str, Tensor] = {}
    takes = ", ".join(f"'{s.name}'" for s in kind.inputs)
    for t in inputs:
        if t.name in by_name:
            raise InvalidRequest(f"input '{t.name}' is given twice", param=t.name)
        if t.name not in {s.name for s in kind.inputs}:
            raise InvalidRequest(
                f"unknown input '{t.name}': {info.served_model_name} ({kind.name}) takes {takes}", param=t.name
            )
        by_name[t.name] = t
    missing = [s.name for s in kind.inputs if s.name not in by_name]
    if missing:
        raise InvalidRequest(
            f"missing input '{missing[0]}': {info.served_model_name} ({kind.name}) takes {takes}", param=missing[0]
        )
    return by_name


def _wanted(kind: Kind, info: ModelInfo, requested: list[str] | None) -> list[str]:
    """The outputs to answer, in the order asked (None: all of the kind's)."""
    names = [s.name for s in kind.outputs(info)]
    if requested is None:
        return names
    for name in requested:
        if name not in names:
            raise InvalidRequest(
                f"unknown output '{name}': {info.served_model_name} ({kind.name}) answers "
                + ", ".join(f"'{n}'" for n in names),
                param=name,
            )
    if len(set(requested)) != len(requested):
        raise InvalidRequest("an output is requested twice", param="outputs")
    return list(requested)


async def infer(
    scope: Scope,
    model: str,
    version: str | None,
    inputs: list[Tensor],
    requested: list[str] | None,
    parameters: Mapping[str, Any],
) -> list[Tensor]:
    """One inference of ``model`` through the serving path: the requested outputs (None: all), in that order.

    ``scope``: the aiohttp request, or on gRPC an object with its ``app``, ``headers``, ``get()`` and ``[]``.
    ``parameters``: the request's; each input's own are in ``Tensor.parameters`` (``dialects.oip_parameters``).
    """
    info = lookup(scope, model, version)
    kind = kind_of(info)
    if kind is None:
        raise InvalidRequest(
            f"{info.served_model_name} (task {info.tasks[0] if info.tasks else None}) has no Open Inference "
            "Protocol tensors: embedding, reranker and classifier models do",
            param="model",
        )
    by_name = _by_name(kind, info, inputs)
    wanted = _wanted(kind, info, requested)
    sources = [("the request", parameters), *((f"input '{t.name}'", t.parameters) for t in inputs)]
    opts = options(kind.options, kind.name, merged(sources))
    answered = {t.name: t for t in await kind.run(scope, info, by_name, opts)}
    return [answered[name] for name in wanted]
