"""Which poolers a model gets: embedders embed (and token_embed); classifiers classify with their score layer.

The model's kind (``workers.load.convert``: embed, classify, token_classify) says
which tasks it serves. An embedding model serves ``embed`` with its pooling (flag > sentence-transformers
> architecture default) and its sentence-transformers Dense projector and
normalization, and ``token_embed`` (every token through the same projector, as ColBERT-style
sentence-transformers folders project token vectors, normalized). A classifier
serves classify and token_classify (a ``*ForTokenClassification``
checkpoint token_classify only) with its score layer (``workers.models.score``)
and activation. The special models (SPLADE, BGE-M3) get their registry entry's
poolers (``workers.pooling.special``), a PyLate ColBERT folder its own (``workers.pooling.pylate``). Every head reads the load's one checkpoint
handle (``workers.load.checkpoint``) and the worker's tokenizer.
"""
from __future__ import annotations

import torch

from poolgate.workers.kernels.ops import REFERENCE, Ops
from poolgate.workers.load.checkpoint import Tensors, strip_prefix
from poolgate.workers.load.convert import KIND_TASKS
from poolgate.workers.models import architecture_for, base_prefixes
from poolgate.workers.models.score import score_layer
from poolgate.workers.pooling.classify import ClassifyHead
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead, load_dense
from poolgate.workers.pooling.rows import all_rows, step_rows
from poolgate.workers.pooling.sources import PoolerSources
from poolgate.workers.pooling.pylate import pylate_poolers
from poolgate.workers.pooling.special import SPECIAL_MODELS
from poolgate.workers.load.pylate import pylate_config
from poolgate.workers.load.st_config import ModelSpec

# the token-level twin of each sequence task, pooled over every token
TOKEN_METHOD = "ALL"
PYLATE_TASKS = ("token_embed",)


def served_tasks(spec: ModelSpec) -> tuple[str, ...]:
    """The tasks ``spec`` is served with, before anything is loaded (``poolgate inspect``)."""
    special = SPECIAL_MODELS.get(spec.architecture)
    if special is None and pylate_config(spec) is not None:
        return PYLATE_TASKS
    return special.tasks if special is not None else KIND_TASKS[spec.kind]


def poolers_for(spec: ModelSpec, device: torch.device, *, weights: Tensors, tokenizer,
                allow_pickle: bool = False, ops: Ops = REFERENCE) -> DispatchPooler:
    """The model's poolers; heads read their tensors from ``weights``, the load's one checkpoint handle, and pool
    with ``ops`` (the backend's bundle: its pooling and L2 normalize kernels)."""
    src = PoolerSources(spec, strip_prefix(weights, base_prefixes(spec)), tokenizer, device, allow_pickle, ops)
    special = SPECIAL_MODELS.get(spec.architecture)
    if special is not None:
        pooler = special.poolers(src)
        if set(pooler.poolers) != set(special.tasks):
            raise ValueError(f"{spec.architecture}: its poolers serve {sorted(pooler.poolers)}, its registry "
                             f"entry says {sorted(special.tasks)} (a bug in poolgate)")
        return pooler
    if pylate_config(spec) is not None:  # PyLate ColBERT (workers.pooling.pylate)
        return pylate_poolers(src)
    return _embed(src) if spec.kind == "embed" else _classify(src)


def sequence_pooling(spec: ModelSpec) -> tuple[str, str]:
    """The sequence tasks' pooling and where it comes from: --pooler-config > sentence-transformers config
    > the architecture's default."""
    if spec.pooler.sequence_pooling:
        return spec.pooler.sequence_pooling, "--pooler-config"
    if spec.pooling_type:
        return spec.pooling_type, "sentence-transformers config"
    return architecture_for(spec).default_pooling, "architecture default"


def token_pooling(spec: ModelSpec) -> str:
    """The token tasks' pooling: --pooler-config's, else ALL."""
    return spec.pooler.token_pooling or TOKEN_METHOD


def _methods(spec: ModelSpec) -> tuple[str, str, object]:
    """(sequence pooling, token pooling, the token pooling's row selector)."""
    tokens = token_pooling(spec)
    rows = step_rows(spec.pooler.step_tag_id) if tokens == "STEP" else all_rows
    return sequence_pooling(spec)[0], tokens, rows


def _embed(src: PoolerSources) -> DispatchPooler:
    spec = src.spec
    pooling, token_pooling, rows = _methods(spec)
    dense = [load_dense(d, allow_pickle=src.allow_pickle) for d in spec.dense]
    projector = torch.nn.Sequential(*dense).to(src.device) if dense else None
    normalize = True if spec.normalize is None else spec.normalize
    embed = EmbedHead(projector, normalize, spec.pooler.dimensions, l2_cut=src.ops.l2_cut)
    return DispatchPooler({"embed": Pooler(pooling, embed),
                           "token_embed": Pooler(token_pooling, EmbedHead(projector, normalize, l2_cut=src.ops.l2_cut),
                                                          rows=rows)},
                          active=spec.pooler.task, ops=src.ops)


def _classify(src: PoolerSources) -> DispatchPooler:
    spec = src.spec
    pooling, token_pooling, rows = _methods(spec)
    tokens = spec.hf_config.get("classifier_from_token")
    score = score_layer(src.weights, spec, src.the_tokenizer("classifier_from_token") if tokens else None)
    calibration = dict(logit_mean=spec.pooler.logit_mean, logit_sigma=spec.pooler.logit_sigma,
                       use_activation=spec.pooler.use_activation)
    classify = ClassifyHead(score.module.to(src.device), score.activation, **calibration)
    columns = spec.pooler.returned_token_ids
    per_token = ClassifyHead(score.token_module.to(src.device), _step_activation(columns) or score.activation,
                             columns=columns, **calibration)
    poolers = {"classify": Pooler(pooling, classify), "token_classify": Pooler(token_pooling, per_token, rows=rows)}
    return DispatchPooler({task: poolers[task] for task in KIND_TASKS[spec.kind]}, active=spec.pooler.task,
                          labels=score.labels, out_dim=score.num_labels, ops=src.ops)


def _step_activation(columns: tuple[int, ...] | None) -> torch.nn.Module | None:
    """STEP with returned_token_ids: the activation over the kept columns only (softmax; sigmoid for one)."""
    if not columns:
        return None
    return torch.nn.Sigmoid() if len(columns) == 1 else torch.nn.Softmax(dim=-1)
