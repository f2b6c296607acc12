"""Rotary embeddings over packed positions in one Triton kernel (``jit.rope``): the ``rope`` op of the bundle.

The contract of ``kernels.rope.apply_rope``: x (n_tokens, heads, head_dim),
cos and sin (n_tokens, 1, rotary_dim) fp32; the first ``rotary_dim`` dims
rotated by halves, the rest copied; a fresh contiguous result in x's dtype.
A program rotates a block of (token, head) rows; cos and sin are rounded to x's
dtype and each product and sum rounded as the reference rounds them, so the
two agree to the bit or within one rounding step. A head view of a fused
projection (a stride between tokens) is read in place. Anything else (not on
a GPU and not under the interpreter, an odd rotary dim, strided last dims)
runs the reference.
"""
from __future__ import annotations

import torch

from poolgate.workers.kernels.gpu.rows import block, rows_per_program, runs_here
from poolgate.workers.kernels.rope import apply_rope


def _takes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    n, _, head_dim = x.shape
    rot = cos.shape[-1]
    return (runs_here(x) and x.stride(-1) == 1 and 0 < rot <= head_dim and rot % 2 == 0
            and all(t.shape == (n, 1, rot) and t.stride(-1) == 1 and t.device == x.device for t in (cos, sin)))


def triton_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rope`` on ``jit.rope`` where it applies (see the module docstring)."""
    if x.dim() != 3 or not _takes(x, cos, sin):
        return apply_rope(x, cos, sin)
    from poolgate.workers.kernels.gpu import jit

    n, heads, head_dim = x.shape
    rot = cos.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows, per = n * heads, rows_per_program(head_dim)
    if rows:
        jit.rope[(-(-rows // per),)](x, x.stride(0), x.stride(1), cos, cos.stride(0), sin, sin.stride(0), out, rows,
                                     heads, head_dim, rot // 2, ROWS=per, BLOCK_HALF=block(rot // 2),
                                     BLOCK_REST=0 if rot == head_dim else block(head_dim - rot), num_warps=4)
    return out
