"""The GPU backends' ops bundle with the Triton kernels in, and the lines their kernels report says.

``triton_ops`` swaps the norms, the linear, RoPE, the pooling methods and the L2 cut of a bundle for this
package's (each hands what it does not take to its torch reference, so a
model built for fp32 and cast later still runs); attention stays the
library's kernel the backend chose (varlen flash on CUDA SM 8.0+, grouped
SDPA elsewhere). ``gpu_ops`` and ``gpu_kernels`` are what CUDA, ROCm and XPU
call: the Triton bundle when ``unavailable()`` is None, and per op what runs
(a Triton kernel's name, or ``torch (why)``).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from poolgate.workers.kernels.attention import AttentionFn
from poolgate.workers.kernels.gpu import unavailable
from poolgate.workers.kernels.gpu.gelu import triton_linear
from poolgate.workers.kernels.gpu.pool import triton_pooling
from poolgate.workers.kernels.gpu.norm import triton_layer_norm, triton_rms_norm
from poolgate.workers.kernels.gpu.rope import triton_rope
from poolgate.workers.kernels.gpu.rows import FLOATS, MAX_DIM
from poolgate.workers.kernels.ops import Ops

KERNELS = {
    "layer_norm": f"Triton norm_rows (residual add + LayerNorm, fp32 statistics, rows up to {MAX_DIM})",
    "rms_norm": f"Triton norm_rows (RMSNorm, Llama and Gemma weights, rows up to {MAX_DIM})",
    "linear": "torch GEMM, then Triton bias_act (bias + GELU/ReLU/SiLU in one pass; no activation: the "
              "GEMM adds the bias)",
    "rope": "Triton rope (rotate halves, partial rotary)",
    "pooling": "Triton pick_rows (CLS, LAST, kept token rows) and segment_mean (MEAN, fp32 sums, kept-row plans)",
    "l2_cut": "Triton l2_cut (matryoshka cut + L2 normalize in one pass)",
}
# the attention the GPU backends pick, as their kernels report says it
ATTENTION = {
    "varlen_flash": "varlen_flash (torch's flash attention, no padding)",
    "grouped_sdpa": "grouped_sdpa (torch SDPA per group of similar lengths)",
}


def triton_ops(ops: Ops, dtype: torch.dtype) -> Ops:
    """``ops`` with the Triton norms, linear, RoPE, pooling and L2 cut in (``dtype``: fp32, fp16 or bf16; else ``ops``)."""
    if dtype not in FLOATS:
        return ops
    return triton_pooling(replace(ops, layer_norm=triton_layer_norm, rms_norm=triton_rms_norm,
                                  linear=triton_linear, rope=triton_rope))


def triton_kernels(dtype: torch.dtype) -> dict[str, str]:
    """Per op of ``triton_ops``: the Triton kernel that runs it for ``dtype`` here, or ``torch (why not)``."""
    why = unavailable() or (None if dtype in FLOATS else
                            f"{str(dtype).removeprefix('torch.')}: the kernels take float32, float16 and bfloat16")
    return {op: line if why is None else f"torch ({why})" for op, line in KERNELS.items()}


def gpu_ops(ops: Ops, dtype: torch.dtype) -> Ops:
    """A GPU backend's bundle: ``triton_ops`` where triton runs here, else ``ops``."""
    return ops if unavailable() is not None else triton_ops(ops, dtype)


def gpu_kernels(attention: AttentionFn, dtype: torch.dtype) -> dict[str, str]:
    """A GPU backend's kernels report: its attention (a library kernel), then ``triton_kernels``."""
    name = getattr(attention, "__name__", type(attention).__name__)
    return {"attention": ATTENTION.get(name, name), **triton_kernels(dtype)}
