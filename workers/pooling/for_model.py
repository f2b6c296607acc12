"""Which poolers a model gets: embedders embed (and token_embed); classifiers classify with their score layer.

The model's kind (``workers.load.convert``: embed, classify, token_classify) says
which tasks it serves. An embedding model serves ``embed`` with its pooling (flag > sentence-transformers
> architecture default) and its sentence-transformers Dense projector and
normalization, and ``token_embed`` (every token through the same projector, as ColBERT-style
sentence-transformers folders project token vectors, normalized). A classifier
serves classify and token_classify (a ``*ForTokenClassification``
checkpoint token_classify only) with its score layer (``workers.models.score``)
and activation.
"""
from __future__ import annotations

import torch

from poolgate.workers.models import architecture_for
from poolgate.workers.load.convert import KIND_TASKS
from poolgate.workers.models.score import score_layer
from poolgate.workers.pooling.classify import ClassifyHead
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.bge_m3 import ARCHITECTURE as BGE_M3
from poolgate.workers.pooling.bge_m3 import bge_m3_poolers
from poolgate.workers.pooling.head import EmbedHead, RawHead, load_dense
from poolgate.workers.pooling.rows import all_rows, step_rows
from poolgate.workers.pooling.splade import MlmHead, SpladePool
from poolgate.workers.load.st_config import ModelSpec
from poolgate.workers.load.weights import load_state_dict

# the token-level twin of each sequence task, pooled over every token
TOKEN_METHOD = "ALL"
SPARSE_ARCHITECTURES = frozenset({"BertSpladeSparseEmbeddingModel"})  # vLLM's name for SPLADE on BERT


def poolers_for(spec: ModelSpec, device: torch.device, *, allow_pickle: bool) -> DispatchPooler:
    pooling = spec.pooling_type or architecture_for(spec).default_pooling
    token_pooling = spec.pooler.token_pooling or TOKEN_METHOD
    rows = step_rows(spec.pooler.step_tag_id) if token_pooling == "STEP" else all_rows
    tasks = KIND_TASKS[spec.kind]
    if spec.architecture in SPARSE_ARCHITECTURES:
        return _splade(spec, device, allow_pickle=allow_pickle)
    if spec.architecture == BGE_M3:
        return bge_m3_poolers(spec.path, device, allow_pickle=allow_pickle, active=spec.pooler.task)
    if spec.kind == "embed":
        dense = [load_dense(d, allow_pickle=allow_pickle) for d in spec.dense]
        projector = torch.nn.Sequential(*dense).to(device) if dense else None
        normalize = True if spec.normalize is None else spec.normalize
        embed = EmbedHead(projector, normalize, spec.pooler.dimensions)
        poolers = {"embed": Pooler(pooling, embed),
                   "token_embed": Pooler(token_pooling, EmbedHead(projector, normalize), rows=rows)}
    else:
        score = score_layer(load_state_dict(spec.path, allow_pickle=allow_pickle), spec)
        calibration = dict(logit_mean=spec.pooler.logit_mean, logit_sigma=spec.pooler.logit_sigma,
                           use_activation=spec.pooler.use_activation)
        classify = ClassifyHead(score.module.to(device), score.activation, **calibration)
        columns = spec.pooler.returned_token_ids
        per_token = ClassifyHead(score.token_module.to(device), _step_activation(columns) or score.activation,
                                 columns=columns, **calibration)
        poolers = {"classify": Pooler(pooling, classify), "token_classify": Pooler(token_pooling, per_token, rows=rows)}
        return DispatchPooler({task: poolers[task] for task in tasks}, active=spec.pooler.task,
                              labels=score.labels, out_dim=score.num_labels)
    return DispatchPooler(poolers, active=spec.pooler.task)


def _splade(spec: ModelSpec, device: torch.device, *, allow_pickle: bool) -> DispatchPooler:
    """embed = SPLADE weights over the vocabulary (no normalization, no matryoshka)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(spec.path))
    special = tuple(i for i in (tokenizer.cls_token_id, tokenizer.sep_token_id) if i is not None)
    head = MlmHead(load_state_dict(spec.path, allow_pickle=allow_pickle), spec.hf_config.get("layer_norm_eps", 1e-12))
    pool = SpladePool(head, special).to(device)
    return DispatchPooler({"embed": Pooler("SPLADE", RawHead(), pool)}, active=spec.pooler.task,
                          out_dim=int(head.decoder.shape[0]))


def _step_activation(columns: tuple[int, ...] | None) -> torch.nn.Module | None:
    """STEP with returned_token_ids: the activation over the kept columns only (softmax; sigmoid for one)."""
    if not columns:
        return None
    return torch.nn.Sigmoid() if len(columns) == 1 else torch.nn.Softmax(dim=-1)
