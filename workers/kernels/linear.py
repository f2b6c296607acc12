"""Linear layers of the ops bundle: the torch reference (``Linear``) and oneDNN's prepacked CPU one.

A model builds every projection with ``ops.linear(in, out, bias, activation)``:
``Linear`` is ``act(F.linear(x, W, b))`` with its activation named, so a
backend can fuse it. ``torch.nn.Linear`` on a bf16 CPU tensor reorders its
weight into oneDNN's blocked layout on every call; ``PackedLinear`` does it
once and fuses GELU/ReLU into the matmul epilogue, and ``prepack_linears``
swaps it in for every ``Linear`` of a model whose weights and dtype are final
(the CPU backend's bf16 ``finalize``). Both are tested against ``Linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from poolgate.shared.config.cpu import cpu_flags, dtype_path
from poolgate.workers.kernels.activations import ACTIVATIONS

# HF hidden_act -> oneDNN post-op (attr, algorithm)
FUSED_ACTIVATIONS: dict[str, tuple[str, str | None]] = {
    "none": ("none", ""),
    "gelu": ("gelu", "none"),  # exact erf GELU
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}


def packed_linear_available() -> bool:
    """Whether bf16 linears can be prepacked here: this torch build has oneDNN's prepacked linear ops and oneDNN
    has a bf16 path for this CPU as ``shared.config.cpu`` shows it (AVX512BW/VL/DQ or AVX-NE-CONVERT; not AVX2 alone)."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and dtype_path("bfloat16", cpu_flags()) != "fallback" and all(
        hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight"))


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class Linear(nn.Linear):
    """``act(x @ W.T + b)``, x: (n, in) → (n, out); ``activation`` is a name of ``ACTIVATIONS`` or "none"."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str = "none"):
        super().__init__(in_features, out_features, bias=bias)
        self.activation = activation
        self.act = _identity if activation == "none" else ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(F.linear(x, self.weight, self.bias))


class PackedLinear(nn.Module):
    """``act(x @ W.T + b)`` with W prepacked for oneDNN; x: (n, in) → (n, out). An activation oneDNN
    cannot fuse (SiLU …) runs after the matmul."""

    def __init__(self, linear: nn.Linear, activation: str = "none"):
        super().__init__()
        fused = activation if activation in FUSED_ACTIVATIONS else "none"
        self.attr, self.algorithm = FUSED_ACTIVATIONS[fused]
        self.after = _identity if fused == activation else ACTIVATIONS[activation]
        self.activation = activation  # as Linear says it: what runs after the matmul (run-time LoRA reads it)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, self.attr, [],
                                                             self.algorithm))


def prepack_linears(model: nn.Module) -> None:
    """Replace every ``Linear`` in ``model`` by a ``PackedLinear`` with the same activation (weights final)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Linear):
                setattr(module, name, PackedLinear(child, child.activation))
