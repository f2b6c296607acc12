"""L2 normalize + matryoshka cut in Triton: the first ``dimensions`` columns of each row, divided by their norm.

One program per row (``pool_jit.l2_cut``), two passes over its kept columns:
the sum of squares in fp32, then each column divided by ``max(norm, 1e-12)``
(``F.normalize``'s eps), so the cut and the normalize are one read and one
write of the kept columns. Without normalize the cut is a view, as in the
reference (``workers.kernels.pooling.l2_cut``); rows on the CPU (not under the
interpreter) go to the reference.
"""
from __future__ import annotations

import torch

from poolgate.workers.kernels import pooling as reference
from poolgate.workers.kernels.gpu.rows import runs_here

BLOCK_COLS = 1024  # columns per step of a row


def l2_cut(x: torch.Tensor, dimensions: int | None, normalize: bool) -> torch.Tensor:
    """(k, dim) → (k, dimensions or dim): the first ``dimensions`` columns (matryoshka), then L2-normalized."""
    if not normalize or not runs_here(x):
        return reference.l2_cut(x, dimensions, normalize)
    from poolgate.workers.kernels.gpu import pool_jit

    if dimensions is not None:
        x = x[:, :dimensions]
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        block = min(BLOCK_COLS, 1 << max(x.shape[1] - 1, 0).bit_length())  # the next power of two, at most BLOCK_COLS
        pool_jit.l2_cut[(x.shape[0],)](x, out, x.shape[1], x.stride(0), out.stride(0), reference.EPS, BLOCK=block)
    return out
