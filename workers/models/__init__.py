"""Architectures with a packed implementation, by Hugging Face ``architectures`` name; the rest fall back.

``ARCHITECTURES`` maps an architecture name to its packed ``Family``
(``workers.models.base``); one family file per model family adds its names
here. Any other architecture runs through transformers' AutoModel, padded
(``workers.models.hf_auto``). ``architecture_for`` says which, and
``build_model`` builds it with the backend's ops bundle (``kernels.ops``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from poolgate.workers.kernels.ops import Ops
from poolgate.workers.load.gguf import load_state as load_gguf_state
from poolgate.workers.models.base import Family, strip_base
from poolgate.workers.models.bert import BERT
from poolgate.workers.models.distilbert import DISTILBERT
from poolgate.workers.models.decoder_families import DECODER_ARCHITECTURES
from poolgate.workers.models.gte import GTE
from poolgate.workers.models.modernbert import MODERNBERT
from poolgate.workers.models.mpnet import MPNET
from poolgate.workers.models.nomic_bert import NOMIC_BERT
from poolgate.workers.models.hf_auto import HfAutoEncoder
from poolgate.workers.load.st_config import ModelSpec
from poolgate.workers.load.weights import load_state_dict, weights_source

ARCHITECTURES: dict[str, Family] = {
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
    "CamembertModel": BERT,
    "CamembertForSequenceClassification": BERT,
    "CamembertForTokenClassification": BERT,
    "BertSpladeSparseEmbeddingModel": BERT,  # a BertForMaskedLM checkpoint served as SPLADE (pooling.splade)
    "BgeM3EmbeddingModel": BERT,  # an XLM-R encoder with BGE-M3's sparse and ColBERT heads (pooling.bge_m3)
    "DistilBertModel": DISTILBERT,
    "DistilBertForMaskedLM": DISTILBERT,  # the encoder only; its MLM head is not used for pooling
    "DistilBertForSequenceClassification": DISTILBERT,
    "DistilBertForTokenClassification": DISTILBERT,
    "MPNetModel": MPNET,
    "MPNetForMaskedLM": MPNET,  # sentence-transformers' all-mpnet-base-v2 names this; the encoder only
    "MPNetForSequenceClassification": MPNET,
    "MPNetForTokenClassification": MPNET,
    "ModernBertModel": MODERNBERT,
    "ModernBertForMaskedLM": MODERNBERT,
    "ModernBertForSequenceClassification": MODERNBERT,
    "ModernBertForTokenClassification": MODERNBERT,
    "NewModel": GTE,  # Alibaba-NLP gte-*-v1.5 / gte-multilingual (Hub remote code; transformers 5: GteModel)
    "NewForSequenceClassification": GTE,
    "NewForTokenClassification": GTE,
    "GteModel": GTE,
    "GteForSequenceClassification": GTE,
    "GteForTokenClassification": GTE,
    "NomicBertModel": NOMIC_BERT,
    "NomicBertForSequenceClassification": NOMIC_BERT,
    "NomicBertForTokenClassification": NOMIC_BERT,
    **DECODER_ARCHITECTURES,  # Llama, Mistral, Qwen2, Qwen3, Gemma 1/2/3: *Model, *ForCausalLM, classifiers
}
DECODER_MARKERS = ("CausalLM", "LMHeadModel")


@dataclass(frozen=True)
class Architecture:
    """What serves one checkpoint: a packed ``family``, or (None) transformers' AutoModel, padded."""

    family: Family | None
    default_pooling: str

    @property
    def packed(self) -> bool:
        return self.family is not None

    @property
    def implementation(self) -> str:
        """For logs and ``inspect``: ``packed <family>`` or ``transformers fallback (padded)``."""
        return f"packed {self.family.name}" if self.family else "transformers fallback (padded)"


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
    """The packed family for ``spec``, else transformers' AutoModel (padded)."""
    family = ARCHITECTURES.get(spec.architecture)
    if family is not None:
        return Architecture(family, family.pooling(spec.hf_config))
    return Architecture(None, "LAST" if is_decoder(spec) else "CLS")


@torch.no_grad()
def build_model(spec: ModelSpec, ops: Ops, *, allow_pickle: bool,
                trust_remote_code: bool = False) -> tuple[nn.Module, Architecture]:
    """The model for ``spec`` with its weights loaded (fp32 or the checkpoint's dtype, on the CPU)."""
    arch = architecture_for(spec)
    if arch.family is None:
        return HfAutoEncoder(spec, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code).eval(), arch
    model = arch.family.model(arch.family.config(spec.hf_config), ops)
    if spec.gguf_file:  # dequantized by transformers' GGUF loader
        state, source = load_gguf_state(spec.path, spec.gguf_file, spec.hf_config), str(spec.path / spec.gguf_file)
    else:
        state, source = load_state_dict(spec.path, allow_pickle=allow_pickle), weights_source(spec.path)
    model.load_weights(strip_base(state, arch.family.prefixes), source)
    return model.eval(), arch
