"""The classify head: score layer → calibration → activation, and the activation a model asks for.

The activation follows vLLM: the config's ``problem_type`` (regression →
none; single-label → softmax, or sigmoid for one label; multi-label →
sigmoid), else a sentence-transformers CrossEncoder's ``activation_fn``
(``torch.nn.modules.*`` only), else sigmoid for one label and softmax for
several. ``use_activation: false`` returns the calibrated logits.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from poolgate.shared.domain.params import PoolingParams

Activation = Callable[[torch.Tensor], torch.Tensor]
PROBLEM_TYPES: dict[str, Callable[[int], Activation]] = {
    "regression": lambda n: nn.Identity(),
    "single_label_classification": lambda n: nn.Softmax(dim=-1) if n >= 2 else nn.Sigmoid(),
    "multi_label_classification": lambda n: nn.Sigmoid(),
}


def activation_for(hf_config: dict) -> Activation:
    """The activation this classifier's config asks for (see the module docstring)."""
    n = int(hf_config.get("num_labels") or len(hf_config.get("id2label") or {}) or 2)
    problem = hf_config.get("problem_type")
    if problem in PROBLEM_TYPES:
        return PROBLEM_TYPES[problem](n)
    st_fn = (hf_config.get("sentence_transformers") or {}).get("activation_fn")
    if st_fn:
        return torch_activation(st_fn, "activation_fn")
    return nn.Sigmoid() if n < 2 else nn.Softmax(dim=-1)


def torch_activation(path: str, field: str) -> nn.Module:
    """Instantiate the ``torch.nn.modules.*`` class a model's config names in ``field`` (nothing else is run)."""
    module, _, name = path.rpartition(".")
    if not module.startswith("torch.nn.modules"):
        raise ValueError(f"refusing {field} {path!r}: only torch.nn.modules.* is allowed")
    return getattr(importlib.import_module(module), name)()


def labels_of(hf_config: dict) -> tuple[str, ...] | None:
    """The class names by index, from ``id2label``."""
    id2label = hf_config.get("id2label")
    if not id2label:
        return None
    return tuple(str(id2label[k]) for k in sorted(id2label, key=int))


class ClassifyHead(nn.Module):
    """(k, hidden) fp32 pooled rows → (k, num_labels) probabilities (or calibrated logits)."""

    def __init__(self, score: nn.Module, activation: Activation, *, logit_mean: float | None = None,
                 logit_sigma: float | None = None, use_activation: bool | None = None,
                 columns: tuple[int, ...] | None = None):
        super().__init__()
        if logit_sigma == 0:
            raise ValueError("logit_sigma must not be 0")
        self.score, self.activation = score, activation
        self.logit_mean, self.logit_sigma = logit_mean, logit_sigma
        self.use_activation = use_activation is not False  # the pooler config's default (None ⇒ on)
        self.columns = list(columns) if columns else None  # STEP's returned_token_ids, kept before activation

    def forward(self, pooled: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        logits = self.score(pooled).float()  # (k, num_labels)
        if self.columns is not None:
            logits = logits[:, self.columns]  # (k, len(columns))
        if self.logit_mean is not None:
            logits = logits - self.logit_mean
        if self.logit_sigma is not None:
            logits = logits / self.logit_sigma
        active = self.use_activation if params.use_activation is None else params.use_activation
        return self.activation(logits) if active else logits
