"""L2 normalize + matryoshka cut in Triton: the first ``dimensions`` columns of each row, divided by their norm.

One program per row, two passes over its kept columns: the sum of squares in
fp32, then each column divided by ``max(norm, 1e-12)`` (``F.normalize``'s eps), so the
cut and the normalize are one read and one write of the kept columns. Without
normalize the cut is a view, as in the reference (``workers.kernels.pooling.l2_cut``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from poolgate.workers.kernels.pooling import EPS

BLOCK_COLS = 1024  # columns per step of a row


@triton.jit
def _l2_cut(x, out, cols, x_stride, out_stride, eps, BLOCK: tl.constexpr):
    """out[r, :cols] = x[r, :cols] / max(||x[r, :cols]||, eps); grid (rows,)."""
    r = tl.program_id(0).to(tl.int64)
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        c = start + tl.arange(0, BLOCK)
        v = tl.load(x + r * x_stride + c, mask=c < cols, other=0.0).to(tl.float32)
        squares += v * v
    norm = tl.maximum(tl.sqrt(tl.sum(squares, axis=0)), eps)
    for start in range(0, cols, BLOCK):
        c = start + tl.arange(0, BLOCK)
        v = tl.load(x + r * x_stride + c, mask=c < cols, other=0.0).to(tl.float32)
        tl.store(out + r * out_stride + c, (v / norm).to(out.dtype.element_ty), mask=c < cols)


def l2_cut(x: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """(k, dim) → (k, dimensions or dim): the first ``dimensions`` columns (matryoshka), then L2-normalized."""
    if dimensions is not None:
        x = x[:, :dimensions]
    if not normalize:
        return x
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        block = min(BLOCK_COLS, triton.next_power_of_2(x.shape[1]))
        _l2_cut[(x.shape[0],)](x, out, x.shape[1], x.stride(0), out.stride(0), EPS, BLOCK=block)
    return out
