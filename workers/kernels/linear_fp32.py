"""The fp32 CPU linear: oneDNN's prepacked fp32 matmul with the bias in its epilogue (``DnnLinear``).

torch's ``F.linear`` in fp32 runs MKL's sgemm after copying the bias into
every output row (a pass over the output, ~6% of the bundled model's
forward on the AVX2 class); ``DnnLinear`` reorders the weight once into
oneDNN's blocked layout and adds the bias in the matmul's epilogue. The
activation runs after it, in place on the matmul's fresh output (the same
kernel as ``Linear``'s): oneDNN's fused GELU measured slower in fp32 (its
erf epilogue on AVX2 cost more than the separate pass saved), and so did
MKL's packed sgemm (``torch.ops.mkl._mkl_linear``). oneDNN builds a
primitive per new row count; the CPU backend's token buckets bound them.
``dnn_linears`` swaps it in for every ``Linear`` of a model whose weights and
dtype are final (the CPU backend's fp32 ``finalize``), on the CPU classes it
measured faster on (``DNN_FP32_CLASSES``; figures in docs/operations.md
"CPU kernels"). Tested against ``Linear``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from poolgate.shared.config.cpu import cpu_class
from poolgate.workers.kernels import gelu_f32
from poolgate.workers.kernels.activations import ACTIVATIONS
from poolgate.workers.kernels.linear import Linear

# the classes where the bundled model's forward ran faster with it (AMX Xeon shown as each class; not generic:
# ARM64 and pre-AVX2 x86, unmeasured)
DNN_FP32_CLASSES = frozenset({"avx2", "avx512", "avx512_bf16", "amx"})

# activation name -> its in-place form on a tensor the matmul just made (the same arithmetic as ``ACTIVATIONS``)
INPLACE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": lambda y: torch.ops.aten.gelu_(y),
    "gelu_new": lambda y: torch.ops.aten.gelu_(y, approximate="tanh"),
    "gelu_pytorch_tanh": lambda y: torch.ops.aten.gelu_(y, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda y: F.silu(y, inplace=True),
}


def _after(activation: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The in-place activation after the matmul: the AVX2 GELU kernel (``kernels.gelu_f32``) for the tanh GELU
    where it runs, else ``INPLACE``'s torch op (``ACTIVATIONS``' for the rest)."""
    if activation in gelu_f32.KERNEL_ACTIVATIONS and gelu_f32.unavailable() is None:
        return lambda y: gelu_f32.gelu_(y, tanh=True)
    return INPLACE.get(activation, ACTIVATIONS[activation])


def dnn_linear_available() -> bool:
    """Whether fp32 linears are prepacked here: this torch build has oneDNN's prepacked linear ops and this CPU
    (as ``shared.config.cpu`` shows it) is of a class it measured faster on."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and cpu_class().name in DNN_FP32_CLASSES and all(
        hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight"))


class DnnLinear(nn.Module):
    """``act(x @ W.T + b)`` with W prepacked for oneDNN in fp32 and the bias in its epilogue, the activation
    after it in place; x: (n, in) fp32 → (n, out)."""

    def __init__(self, linear: nn.Linear, activation: str = "none"):
        super().__init__()
        self.activation = activation  # as Linear says it (run-time LoRA reads it)
        self.after = None if activation == "none" else _after(activation)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return y if self.after is None else self.after(y)


def dnn_linears(model: nn.Module) -> None:
    """Replace every ``Linear`` of ``model`` by a ``DnnLinear`` with the same activation (weights final)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Linear):
                setattr(module, name, DnnLinear(child, child.activation))
