"""oneDNN linear for CPUs: the weight reordered once at load, GELU fused into the matmul epilogue.

``torch.nn.Linear`` on a bf16 CPU tensor reorders its weight into oneDNN's
blocked layout on every call; ``PackedLinear`` does it once. Its reference is
``F.linear`` followed by the activation (tested against it).
"""
from __future__ import annotations

import torch
from torch import nn

# HF hidden_act -> oneDNN post-op (attr, algorithm)
FUSED_ACTIVATIONS: dict[str, tuple[str, str | None]] = {
    "none": ("none", ""),
    "gelu": ("gelu", "none"),  # exact erf GELU
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}


def packed_linear_available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear ops."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight"))


class PackedLinear(nn.Module):
    """``act(x @ W.T + b)`` with W prepacked for oneDNN; x: (n, in) → (n, out)."""

    def __init__(self, linear: nn.Linear, activation: str = "none"):
        super().__init__()
        self.attr, self.algorithm = FUSED_ACTIVATIONS[activation]
        self.out_features = linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, self.attr, [], self.algorithm)
