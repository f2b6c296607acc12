"""Score layers of classifier checkpoints, recognised by their weight names, and the tasks they serve.

transformers' ``*ForSequenceClassification`` and ``*ForTokenClassification``
put a small head after the encoder; its weights sit beside the encoder's in
the checkpoint. ``SCORE_LAYERS`` lists, first match wins, the weight names
each family uses and how to build its head as an ``nn.Module`` over pooled
hidden states. The architecture's name suffix says which tasks the head
serves (``CLASSIFIER_TASKS``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from poolgate.workers.weights import strip_prefix

BASE_PREFIXES = ("bert.", "roberta.", "distilbert.", "model.", "transformer.")

# architecture-name suffix -> the tasks its score layer serves (first = the active task's pooling)
CLASSIFIER_TASKS: dict[str, tuple[str, ...]] = {
    "ForSequenceClassification": ("classify", "token_classify"),
    "ForTokenClassification": ("token_classify",),
}


def _linear(state: dict[str, torch.Tensor], name: str) -> nn.Linear:
    weight, bias = state[f"{name}.weight"], state.get(f"{name}.bias")
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    layer.load_state_dict({"weight": weight, **({"bias": bias} if bias is not None else {})})
    return layer


@dataclass(frozen=True)
class ScoreLayer:
    """A family's head: the weights it needs and how to assemble them."""

    needs: tuple[str, ...]
    build: Callable[[dict[str, torch.Tensor]], nn.Module]


SCORE_LAYERS: tuple[ScoreLayer, ...] = (
    # RoBERTa / XLM-R: classifier.dense → tanh → classifier.out_proj (on the <s> token)
    ScoreLayer(("classifier.dense.weight", "classifier.out_proj.weight"),
               lambda s: nn.Sequential(_linear(s, "classifier.dense"), nn.Tanh(), _linear(s, "classifier.out_proj"))),
    # BERT: the pooler (dense → tanh on [CLS]) → classifier
    ScoreLayer(("pooler.dense.weight", "classifier.weight"),
               lambda s: nn.Sequential(_linear(s, "pooler.dense"), nn.Tanh(), _linear(s, "classifier"))),
    # DistilBERT: pre_classifier → relu → classifier
    ScoreLayer(("pre_classifier.weight", "classifier.weight"),
               lambda s: nn.Sequential(_linear(s, "pre_classifier"), nn.ReLU(), _linear(s, "classifier"))),
    # token classifiers (BERT, RoBERTa, ...): one linear per token
    ScoreLayer(("classifier.weight",), lambda s: _linear(s, "classifier")),
    # decoders (Llama, Qwen, Mistral ...ForSequenceClassification): score, no bias
    ScoreLayer(("score.weight",), lambda s: _linear(s, "score")),
)


def classifier_tasks(architecture: str) -> tuple[str, ...] | None:
    """The tasks of a classifier architecture, or None for an embedding model."""
    return next((tasks for suffix, tasks in CLASSIFIER_TASKS.items() if architecture.endswith(suffix)), None)


def score_layer(state: dict[str, torch.Tensor]) -> nn.Module:
    """The checkpoint's head, as the first family whose weights are all present builds it."""
    state = strip_prefix(state, BASE_PREFIXES)
    for layer in SCORE_LAYERS:
        if all(name in state for name in layer.needs):
            return layer.build(state).float().eval()
    raise ValueError("the checkpoint is a classifier but has no score layer poolgate knows "
                     f"(looked for: {', '.join(' + '.join(l.needs) for l in SCORE_LAYERS)})")
