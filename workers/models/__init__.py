"""Architectures with a packed implementation, by Hugging Face ``architectures`` name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from poolgate.workers.kernels.attention import AttentionFn
from poolgate.workers.models.bert import BASE_PREFIXES, BertConfig, BertEncoder
from poolgate.workers.models.hf_auto import HfAutoEncoder
from poolgate.workers.st_config import ModelSpec
from poolgate.workers.weights import load_state_dict, strip_prefix


@dataclass(frozen=True)
class Architecture:
    """How to build one family, and its pooling default when the model does not say."""

    build: Callable[[ModelSpec, AttentionFn, bool], nn.Module]
    default_pooling: str
    packed: bool = True


def _build_bert(spec: ModelSpec, attention: AttentionFn, allow_pickle: bool) -> nn.Module:
    model = BertEncoder(BertConfig.from_hf(spec.hf_config), attention)
    state = strip_prefix(load_state_dict(spec.path, allow_pickle=allow_pickle), BASE_PREFIXES)
    model.load_hf_state(state)
    return model.eval()


def _build_hf(spec: ModelSpec, attention: AttentionFn, allow_pickle: bool) -> nn.Module:
    return HfAutoEncoder(spec, allow_pickle=allow_pickle)


BERT = Architecture(_build_bert, default_pooling="CLS")
ARCHITECTURES: dict[str, Architecture] = {
    "BertModel": BERT,
    "BertForMaskedLM": BERT,
    "RobertaModel": BERT,
    "XLMRobertaModel": BERT,
    # classifiers: the packed encoder; their score layer comes from workers.models.score
    "BertForSequenceClassification": BERT,
    "BertForTokenClassification": BERT,
    "RobertaForSequenceClassification": BERT,
    "RobertaForTokenClassification": BERT,
    "XLMRobertaForSequenceClassification": BERT,
    "XLMRobertaForTokenClassification": BERT,
    "BertSpladeSparseEmbeddingModel": BERT,  # a BertForMaskedLM checkpoint served as SPLADE (pooling.splade)
    "BgeM3EmbeddingModel": BERT,  # an XLM-R encoder with BGE-M3's sparse and ColBERT heads (pooling.bge_m3)
}
DECODER_MARKERS = ("CausalLM", "LMHeadModel")


def is_decoder(spec: ModelSpec) -> bool:
    """Causal LMs pool their LAST token: a causal-LM architecture, or a model type that
    transformers knows as a causal LM and not as a masked LM (Llama yes, BERT no)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    if any(m in spec.architecture for m in DECODER_MARKERS) or spec.hf_config.get("is_decoder"):
        return True
    kind = spec.hf_config.get("model_type", "")
    return kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def architecture_for(spec: ModelSpec) -> Architecture:
    """The packed implementation for ``spec``, else transformers' AutoModel (padded)."""
    if spec.architecture in ARCHITECTURES:
        return ARCHITECTURES[spec.architecture]
    return Architecture(_build_hf, default_pooling="LAST" if is_decoder(spec) else "CLS", packed=False)


@torch.no_grad()
def build_model(spec: ModelSpec, attention: AttentionFn, *, allow_pickle: bool) -> tuple[nn.Module, Architecture]:
    arch = architecture_for(spec)
    return arch.build(spec, attention, allow_pickle), arch
