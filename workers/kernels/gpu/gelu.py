"""A linear whose bias and activation run as one Triton pass over its output (``jit.bias_act``).

``TritonLinear`` is the ops bundle's ``Linear`` (the same ``weight``, ``bias``
and ``activation``, so checkpoints load and run-time LoRA reads it as it does):
the matmul stays torch's (``F.linear`` without the bias: cuBLAS, hipBLASLt or
oneDNN on the GPU), then one kernel adds the bias and applies GELU (erf, or
tanh for ``gelu_new``/``gelu_pytorch_tanh``), ReLU or SiLU in fp32 over the
output in place, where torch would run the bias in the GEMM and the activation
as a second pass over memory. A linear without an activation is ``F.linear``
with its bias: the BLAS library adds it in the GEMM's epilogue, which no
separate pass beats. Where the kernel does not apply (not on a GPU and not
under the interpreter, an activation it does not know) the reference runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from poolgate.workers.kernels.gpu.rows import runs_here
from poolgate.workers.kernels.linear import Linear

BLOCK = 1024  # output elements a program
FUSED = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu")  # the activations ``jit.bias_act`` runs


class TritonLinear(Linear):
    """``act(x @ W.T + b)``, x: (n, in) → (n, out); the bias and ``activation`` in one Triton pass."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation not in FUSED or not runs_here(x):
            return super().forward(x)
        y = F.linear(x, self.weight)  # (n, out)
        b = self.bias
        if not y.is_contiguous() or (b is not None and not (b.is_contiguous() and b.device == y.device)):
            return self.act(y if b is None else y + b)
        from poolgate.workers.kernels.gpu import jit

        n = y.numel()
        if n:
            jit.bias_act[(-(-n // BLOCK),)](y, y if b is None else b, n, y.shape[-1],
                                            ACT=jit.ACT_CODES[self.activation], HAS_BIAS=b is not None,
                                            BLOCK=BLOCK, num_warps=4)
        return y


def triton_linear(in_features: int, out_features: int, bias: bool = True, activation: str = "none") -> Linear:
    return TritonLinear(in_features, out_features, bias=bias, activation=activation)
