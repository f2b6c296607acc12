"""Score layers of classifiers: the checkpoint's own (recognised by weight names) or LM-head rows.

transformers' ``*ForSequenceClassification`` and ``*ForTokenClassification``
put a small head after the encoder; its weights sit beside the encoder's in
the checkpoint. ``SCORE_LAYERS`` lists, first match wins, the weight names
each family uses and how to build its head as an ``nn.Module`` over pooled
hidden states. A generative checkpoint served with ``--convert classify`` and
``--hf-overrides '{"classifier_from_token": [...]}'`` gets a score layer made
of the LM head's rows for those tokens; two tokens ``[no, yes]`` become one
score, ``sigmoid(logit_yes - logit_no)`` (as Qwen3-Reranker is used).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from poolgate.workers.models.modernbert import ModernBertHead
from poolgate.workers.pooling.classify import activation_for, labels_of

TEMPERATURE_TYPES = frozenset({"llama_bidirec"})  # classifiers that divide their logits by config temperature
LM_HEADS = ("lm_head.weight", "embed_tokens.weight", "embeddings.word_embeddings.weight")  # tied heads last


def _linear(state: Mapping[str, torch.Tensor], name: str) -> nn.Linear:
    weight, bias = state[f"{name}.weight"], state.get(f"{name}.bias")
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    layer.load_state_dict({"weight": weight, **({"bias": bias} if bias is not None else {})})
    return layer


@dataclass(frozen=True)
class ScoreLayer:
    """A family's head: the weights it needs and how to assemble it, as (the sequence head, the
    per-token head). They differ only for BERT, whose pooler (dense → tanh) pools [CLS] for classify
    and is not part of the classifier that token_classify applies to every token."""

    needs: tuple[str, ...]
    build: Callable[[Mapping[str, torch.Tensor], dict], tuple[nn.Module, nn.Module]]  # (state, hf config)


def _same(module: nn.Module) -> tuple[nn.Module, nn.Module]:
    return module, module


# The activation between the two linears of a pooler-style head (``pooler.dense`` → act → ``classifier``,
# or ``classifier.dense`` → act → ``classifier.out_proj``), by ``model_type``. The weight names alone do
# not say it (ELECTRA and DeBERTa name their layers as BERT and RoBERTa do but use GELU), so a model type
# not listed here is refused rather than scored with a guessed activation.
TANH_HEADS = frozenset({"bert", "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "new", "gte",
                        "nomic_bert", "albert", "megatron-bert", "ernie", "data2vec-text", "longformer"})
HEAD_ACTIVATIONS: dict[str, Callable[[dict], str]] = {
    "electra": lambda hf: "gelu",  # ElectraClassificationHead
    "deberta": lambda hf: hf.get("pooler_hidden_act", "gelu"),  # ContextPooler
    "deberta-v2": lambda hf: hf.get("pooler_hidden_act", "gelu"),
}


def _head_activation(hf: dict) -> nn.Module:
    from transformers.activations import ACT2FN

    kind = hf.get("model_type", "")
    if kind in TANH_HEADS:
        return nn.Tanh()
    if kind in HEAD_ACTIVATIONS:
        return ACT2FN[HEAD_ACTIVATIONS[kind](hf)]
    raise ValueError(f"the classifier head of model_type '{kind}' is not one poolgate has verified (its layer "
                     "names match a BERT/RoBERTa-style head, but the activation between them differs between "
                     "families); serve it as an embedder, or open an issue with the checkpoint's architecture")


def _bert(state: Mapping[str, torch.Tensor], hf: dict) -> tuple[nn.Module, nn.Module]:
    classifier = _linear(state, "classifier")
    return nn.Sequential(_linear(state, "pooler.dense"), _head_activation(hf), classifier), classifier


SCORE_LAYERS: tuple[ScoreLayer, ...] = (
    # ModernBERT: head (dense → act → norm) → classifier, on the pooled row and on every token alike
    ScoreLayer(("head.dense.weight", "head.norm.weight", "classifier.weight"),
               lambda s, hf: _same(ModernBertHead(s, hf))),
    # RoBERTa / XLM-R: classifier.dense → tanh (GELU for ELECTRA) → classifier.out_proj (on the <s> token)
    ScoreLayer(("classifier.dense.weight", "classifier.out_proj.weight"), lambda s, hf: _same(
        nn.Sequential(_linear(s, "classifier.dense"), _head_activation(hf), _linear(s, "classifier.out_proj")))),
    # BERT: the pooler (dense → tanh on [CLS]; DeBERTa: its pooler_hidden_act) → classifier; per token, the
    # classifier alone. Token
    # classifiers that still carry the unused pooler weights land here too and get the classifier.
    ScoreLayer(("pooler.dense.weight", "classifier.weight"), _bert),
    # DistilBERT: pre_classifier → relu → classifier
    ScoreLayer(("pre_classifier.weight", "classifier.weight"), lambda s, hf: _same(
        nn.Sequential(_linear(s, "pre_classifier"), nn.ReLU(), _linear(s, "classifier")))),
    # token classifiers (BERT, RoBERTa, ...): one linear per token
    ScoreLayer(("classifier.weight",), lambda s, hf: _same(_linear(s, "classifier"))),
    # decoders (Llama, Qwen, Mistral ...ForSequenceClassification): score, no bias
    ScoreLayer(("score.weight",), lambda s, hf: _same(_linear(s, "score"))),
)


@dataclass(frozen=True)
class Score:
    """A classifier's score layer, its activation, and what it outputs."""

    module: nn.Module  # over the pooled sequence (classify)
    token_module: nn.Module  # over each token (token_classify)
    activation: nn.Module
    num_labels: int
    labels: tuple[str, ...] | None


def score_layer(state: Mapping[str, torch.Tensor], spec, tokenizer: Any) -> Score:
    """The model's score layer: from ``classifier_from_token`` if configured, else the checkpoint's own.
    ``state`` is the checkpoint with its base-model prefix dropped (``pooling.sources``); only the head's
    tensors are read. ``tokenizer`` (the worker's) turns ``classifier_from_token`` into ids."""
    tokens = spec.hf_config.get("classifier_from_token")
    step_lm = spec.pooler.token_pooling == "STEP" and not tokens and not _has_own(state)
    if tokens:
        module, token_module = _same(_from_tokens(state, tokenizer, tokens))
    else:
        module, token_module = _same(_lm_head(state)) if step_lm else _own(state, spec.hf_config)
    module, token_module = _tempered(module, spec.hf_config), _tempered(token_module, spec.hf_config)
    module, token_module = module.float().eval(), token_module.float().eval()
    num_labels = _out_features(module)
    if tokens:
        labels, activation = (None, nn.Sigmoid()) if num_labels == 1 else (tuple(tokens), nn.Softmax(dim=-1))
        return Score(module, token_module, activation, num_labels, labels)
    labels = labels_of(spec.hf_config)
    return Score(module, token_module, activation_for({**spec.hf_config, "num_labels": num_labels}), num_labels,
                 labels if labels and len(labels) == num_labels else None)


class _Divide(nn.Module):
    def __init__(self, by: float):
        super().__init__()
        self.by = by

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.by


def _tempered(module: nn.Module, hf: dict) -> nn.Module:
    """The score layer with the logits divided by the config's ``temperature``, for the model types whose
    classifier divides by it (``TEMPERATURE_TYPES``; nemotron rerank's ``pooled_logits / temperature``)."""
    temperature = float(hf.get("temperature", 1.0)) if hf.get("model_type") in TEMPERATURE_TYPES else 1.0
    return module if temperature == 1.0 else nn.Sequential(module, _Divide(temperature))


def _own(state: Mapping[str, torch.Tensor], hf: dict) -> tuple[nn.Module, nn.Module]:
    for layer in SCORE_LAYERS:
        if all(name in state for name in layer.needs):
            return layer.build(state, hf)
    raise ValueError("this classifier has no score layer poolgate knows (looked for: "
                     f"{', '.join(' + '.join(l.needs) for l in SCORE_LAYERS)}); a generative checkpoint "
                     "needs --hf-overrides '{\"classifier_from_token\": [...]}'")


def _has_own(state: Mapping[str, torch.Tensor]) -> bool:
    return any(all(name in state for name in layer.needs) for layer in SCORE_LAYERS)


def _lm_head(state: Mapping[str, torch.Tensor]) -> nn.Module:
    """The whole LM head (vocabulary outputs): STEP reward models read it through returned_token_ids."""
    name = next((n for n in LM_HEADS if n in state), None)
    if name is None:
        raise ValueError(f"STEP pooling on a generative checkpoint needs its LM head; none of {LM_HEADS} found")
    return _linear(state, name.removesuffix(".weight"))


def _from_tokens(state: Mapping[str, torch.Tensor], tokenizer: Any, tokens: list[str]) -> nn.Module:
    """Rows of the LM head for ``tokens``; [no, yes] → one row, yes − no."""
    head = next((state[name] for name in LM_HEADS if name in state), None)
    if head is None:
        raise ValueError(f"classifier_from_token needs an LM head; the checkpoint has none of {LM_HEADS}")
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    unknown = [t for t, i in zip(tokens, ids)
               if i is None or i >= head.shape[0] or (i == tokenizer.unk_token_id and t != tokenizer.unk_token)]
    if unknown:
        raise ValueError(f"classifier_from_token: tokens {unknown} are not in the vocabulary")
    rows = head[ids].float()  # (len(tokens), hidden)
    weight = (rows[1] - rows[0])[None] if len(tokens) == 2 else rows
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.load_state_dict({"weight": weight})
    return layer


def _out_features(module: nn.Module) -> int:
    return [m for m in module.modules() if isinstance(m, nn.Linear)][-1].out_features
