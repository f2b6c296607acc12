"""What the Triton kernels of this package take: the device, the dtype, the row layout, and launch sizes."""
from __future__ import annotations

import torch

from poolgate.workers.kernels.gpu import interpreting

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
MAX_DIM = 16384  # one row in one program's registers (fp32): wider rows run the reference
GPU_DEVICES = ("cuda", "xpu")  # ROCm's torch names its GPUs "cuda"


def runs_here(t: torch.Tensor) -> bool:
    """Whether a kernel can take ``t``'s device and dtype: a GPU tensor, or a CPU one under the interpreter."""
    if t.dtype not in FLOATS:
        return False
    kind = t.device.type
    return kind in GPU_DEVICES or (kind == "cpu" and interpreting())


def row_layout(t: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(rows, heads, stride0, stride1) of ``t`` read as rows of its last dim: a 2-D tensor (heads 1) or a
    3-D one such as a head view of a fused projection, (n, heads, dim), with the last dim dense; None else."""
    if t.stride(-1) != 1 or t.shape[-1] == 0:
        return None
    if t.dim() == 2:
        return t.shape[0], 1, t.stride(0), 0
    if t.dim() == 3:
        return t.shape[0] * t.shape[1], t.shape[1], t.stride(0), t.stride(1)
    return None


def block(n: int) -> int:
    """The power of two a program's block spans for ``n`` elements."""
    return 1 << max(0, (n - 1).bit_length())


TILE = 4096  # values a program holds in registers (fp32): rows of a narrow tensor share a program up to it


def rows_per_program(width: int) -> int:
    """How many rows of ``block(width)`` values one program takes: up to ``TILE`` values, at least one row."""
    return max(1, TILE // block(width))


def warps(values: int) -> int:
    """Warps for a program of ``values`` fp32 values (about 8 a thread, 1 to 16 warps)."""
    return min(16, max(1, values // 256))
