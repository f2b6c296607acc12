"""Architectures with a packed implementation, by Hugging Face ``architectures`` name; the rest fall back.

``ARCHITECTURES`` maps an architecture name to its packed ``Family``
(``workers.models.base``); one family file per model family adds its names
here, each a head (``head_kind``: ``*Model``, ``*ForSequenceClassification`` …)
its family declares, and the special models (``workers.pooling.special``)
join with their encoder's family. Any other architecture runs through transformers' AutoModel, padded
(``workers.models.hf_auto``). ``architecture_for`` says which, and
``build_model`` builds it with the backend's ops bundle (``kernels.ops``).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from poolgate.workers.kernels.ops import Ops
from poolgate.workers.load.gguf import load_state as load_gguf_state
from poolgate.workers.models.base import Family
from poolgate.workers.models.bert import BERT
from poolgate.workers.models.distilbert import DISTILBERT
from poolgate.workers.models.decoder_families import DECODER_ARCHITECTURES
from poolgate.workers.models.gte import GTE
from poolgate.workers.models.jina_xlmr import JINA_XLMR
from poolgate.workers.models.modernbert import MODERNBERT
from poolgate.workers.models.mpnet import MPNET
from poolgate.workers.models.nomic_bert import NOMIC_BERT
from poolgate.workers.models.hf_auto import HfAutoEncoder
from poolgate.workers.load.st_config import ModelSpec
from poolgate.workers.pooling.special import SPECIAL_MODELS
from poolgate.workers.load.checkpoint import Checkpoint, Deferred, Tensors, strip_prefix
from poolgate.workers.load.lora import DEFAULT_TASKS, PER_REQUEST, task_loras, with_task_adapter
from poolgate.workers.models.task_adapters import attach

ARCHITECTURES: dict[str, Family] = {
    "BertModel": BERT,
    "BertForMaskedLM": BERT,
    "RobertaModel": BERT,
    "XLMRobertaModel": BERT,
    # masked LMs served as embedders: the encoder only, the MLM head (cls. / lm_head.) is not used for pooling
    "RobertaForMaskedLM": BERT,
    "XLMRobertaForMaskedLM": BERT,
    "CamembertForMaskedLM": BERT,
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
    "GteNewModel": GTE,  # vLLM's names for gte-multilingual (--hf-overrides '{"architectures": [...]}')
    "GteNewForSequenceClassification": GTE,
    "GteModel": GTE,
    "GteForSequenceClassification": GTE,
    "GteForTokenClassification": GTE,
    "JinaRobertaModel": JINA_XLMR,  # jina-embeddings-v3 (an XLMRobertaModel config with rotary positions)
    "NomicBertModel": NOMIC_BERT,
    "NomicBertForSequenceClassification": NOMIC_BERT,
    "NomicBertForTokenClassification": NOMIC_BERT,
    **DECODER_ARCHITECTURES,  # Llama, Mistral, Qwen2, Qwen3, Gemma 1/2/3: *Model, *ForCausalLM, classifiers
}
# the special models (SPLADE, BGE-M3: workers.pooling.special) run the packed family of their encoder
ARCHITECTURES.update({name: ARCHITECTURES[s.encoder] for name, s in SPECIAL_MODELS.items()})
DECODER_MARKERS = ("CausalLM", "LMHeadModel")
HEAD_SUFFIXES = {"ForSequenceClassification": "sequence_classification",
                 "ForTokenClassification": "token_classification", "ForMaskedLM": "masked_lm",
                 "ForCausalLM": "causal_lm"}


def head_kind(architecture: str) -> str:
    """The ``Family.heads`` kind an architecture name asks for (``*Model`` and the special models: ``model``)."""
    return next((kind for suffix, kind in HEAD_SUFFIXES.items() if architecture.endswith(suffix)), "model")


def _check_heads(table: dict[str, Family]) -> None:
    """Each registered name is a head its family declares (a registry typo fails at import, not at load)."""
    wrong = sorted(name for name, family in table.items() if head_kind(name) not in family.heads)
    if wrong:
        raise ValueError(f"architectures registered with a head their family does not declare: {wrong}")


_check_heads(ARCHITECTURES)


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


SKIPPED_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                 "xavier_uniform_", "xavier_normal_", "ones_", "zeros_", "constant_")


@contextmanager
def _no_random_init():
    """Build a packed model without filling its parameters at random: ``load_mapped`` fills every one of
    them from the checkpoint or refuses the load, so the random fill (seconds for a 1B model) is wasted."""
    saved = {name: getattr(torch.nn.init, name) for name in SKIPPED_INITS}
    for name in SKIPPED_INITS:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def open_weights(spec: ModelSpec, *, allow_pickle: bool) -> Tensors:
    """The one lazy handle on ``spec``'s weights that the model and its poolers read (a GGUF file: dequantized)."""
    if spec.gguf_file:  # dequantized by transformers' GGUF loader, when first asked for
        return Deferred(lambda: load_gguf_state(spec.path, spec.gguf_file, spec.hf_config), spec.path / spec.gguf_file)
    return Checkpoint.open(spec.path, allow_pickle=allow_pickle)


def base_prefixes(spec: ModelSpec) -> tuple[str, ...]:
    """Where the checkpoint keeps the base model (``bert.``, ``model.``): the family's, or for the fallback
    transformers' ``base_model_prefix`` of the architecture's class and of the AutoModel it loads."""
    family = ARCHITECTURES.get(spec.architecture)
    if family is not None:
        return family.prefixes
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    base = MODEL_MAPPING_NAMES.get(spec.hf_config.get("model_type", ""))  # the AutoModel the fallback loads
    prefixes = [getattr(getattr(transformers, name, None), "base_model_prefix", "") for name in (spec.architecture, base)
                if isinstance(name, str)]
    return tuple(dict.fromkeys(f"{p}." for p in prefixes if p))


@torch.no_grad()
def build_model(spec: ModelSpec, ops: Ops, *, weights: Tensors | None = None, allow_pickle: bool = False,
                trust_remote_code: bool = False, allow_partial: bool = False) -> tuple[nn.Module, Architecture]:
    """The model for ``spec`` with its weights loaded from ``weights`` (opened here if not given; the heads
    read theirs first) in fp32 or the checkpoint's dtype, on the CPU. The fallback reads its checkpoint
    through transformers and checks what it did not place against what the heads read."""
    arch = architecture_for(spec)
    if arch.family is None:
        heads_read = strip_prefix(weights, base_prefixes(spec)) if weights is not None else None
        return HfAutoEncoder(spec, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                             heads_read=heads_read, allow_partial=allow_partial).eval(), arch
    weights = weights if weights is not None else open_weights(spec, allow_pickle=allow_pickle)
    with _no_random_init():
        model = arch.family.model(arch.family.config(spec.hf_config), ops)
    state = with_task_adapter(strip_prefix(weights, arch.family.prefixes), spec.architecture, spec.path,
                              spec.hf_config)  # jina-embeddings-v5: its task's LoRA merged (workers.load.lora)
    model.load_weights(state, weights.source)
    if spec.architecture in DEFAULT_TASKS and spec.hf_config.get("jina_task") == PER_REQUEST:  # unmerged base:
        loras = task_loras(state, spec.architecture, spec.path, spec.hf_config)  # each call's task LoRA applied
        attach(model, loras, DEFAULT_TASKS[spec.architecture], state.shape)
    return model.eval(), arch
