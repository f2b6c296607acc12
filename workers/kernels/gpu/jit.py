"""The Triton kernels of ``norm``, ``gelu`` and ``rope`` (imported on the first launch, never at start).

``triton.jit`` decides at decoration whether a kernel is compiled or run by the
interpreter (``TRITON_INTERPRET``), so this module is imported only when a
module of this package launches its first kernel: a CPU worker never imports
triton, and the interpreter tests set the variable before that first launch.
The kernels use only triton's built-in operations (no ``tl.sum``,
``tl.sigmoid`` and kin: those are jitted when triton is imported, which may
be before the variable is set). Every load is widened to fp32 before any arithmetic, and every value the
torch reference rounds to the input dtype (a residual sum, the Llama norm
before its weight, RoPE's products) is rounded the same way here, so the
results follow the references to the last bit or within a rounding step.
"""
from __future__ import annotations

import triton
import triton.language as tl

# the activations of ``bias_act``, by ``Linear.activation``
ACT_CODES = {"gelu": 1, "gelu_new": 2, "gelu_pytorch_tanh": 2, "relu": 3, "silu": 4}


# tl.sum's own reduction (``standard.py``: ``reduce(input, axis, _sum_combine)``), named so the interpreter's
# numpy sum takes it whether or not triton was imported under the interpreter; ``tl.sum`` itself is a function
# jitted at triton's import, which the interpreter cannot call if that import was not under it
_sum = tl.standard._sum_combine


@triton.jit
def norm_rows(x_ptr, xs0, xs1, r_ptr, rs0, rs1, o_ptr, os0, os1, w_ptr, b_ptr, n_rows, heads, dim, eps,
              RMS: tl.constexpr, GEMMA: tl.constexpr, HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr,
              ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """ROWS rows a program: row ``p`` is ``[p // heads, p % heads]`` of a (n, heads, dim) tensor (heads 1:
    2-D). LayerNorm of ``x + r`` (RMS 0) or RMSNorm of it (RMS 1, GEMMA: weight as an offset from 1)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # (ROWS, 1)
    i = rows // heads
    h = rows % heads
    cols = tl.arange(0, BLOCK)[None, :]  # (1, BLOCK)
    mask = (rows < n_rows) & (cols < dim)
    x = tl.load(x_ptr + i * xs0 + h * xs1 + cols, mask=mask, other=0.0)
    dt = x.dtype
    x = x.to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + i * rs0 + h * rs1 + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + r).to(dt).to(tl.float32)  # the sum as the reference's add leaves it
    w = tl.load(w_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    if RMS:
        y = x * tl.rsqrt(tl.reduce(x * x, 1, _sum)[:, None] / dim + eps)
        if GEMMA:
            y = y * (1.0 + w)
        else:
            y = w * y.to(dt).to(tl.float32)
    else:
        mean = tl.reduce(x, 1, _sum)[:, None] / dim
        xc = tl.where(mask, x - mean, 0.0)
        y = xc * tl.rsqrt(tl.reduce(xc * xc, 1, _sum)[:, None] / dim + eps) * w
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    tl.store(o_ptr + i * os0 + h * os1 + cols, y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def bias_act(y_ptr, b_ptr, n, width, ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """``y = act(y + b)`` in place over a contiguous (rows, width) ``y``; BLOCK elements a program."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y = y + tl.load(b_ptr + offs % width, mask=mask, other=0.0).to(tl.float32)
    if ACT == 1:  # GELU, erf
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == 2:  # GELU, tanh: tanh(u) = 2 / (1 + exp(-2u)) - 1
        u = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        y = 0.5 * y * (2.0 / (1.0 + tl.exp(-2.0 * u)))
    elif ACT == 3:
        y = tl.maximum(y, 0.0)
    elif ACT == 4:  # SiLU
        y = y / (1.0 + tl.exp(-y))
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope(x_ptr, xs0, xs1, c_ptr, cs0, s_ptr, ss0, o_ptr, n_rows, heads, head_dim, half,
         ROWS: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr):
    """ROWS (token, head) rows a program, row ``p`` = ``[p // heads, p % heads]``: the first ``2 * half`` dims
    rotated (rotate halves), the rest copied; ``o`` is a contiguous (n, heads, head_dim)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # (ROWS, 1)
    t = rows // heads
    live = rows < n_rows
    d = tl.arange(0, BLOCK_HALF)[None, :]
    mask = live & (d < half)
    x_row = x_ptr + t * xs0 + (rows % heads) * xs1
    out = o_ptr + rows * head_dim
    x1 = tl.load(x_row + d, mask=mask, other=0.0)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(x_row + half + d, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(c_ptr + t * cs0 + d, mask=mask, other=0.0).to(dt).to(tl.float32)
    c2 = tl.load(c_ptr + t * cs0 + half + d, mask=mask, other=0.0).to(dt).to(tl.float32)
    s1 = tl.load(s_ptr + t * ss0 + d, mask=mask, other=0.0).to(dt).to(tl.float32)
    s2 = tl.load(s_ptr + t * ss0 + half + d, mask=mask, other=0.0).to(dt).to(tl.float32)
    # x * cos + rotate_half(x) * sin, each product and the sum rounded as the reference's ops round them
    o1 = (x1 * c1).to(dt).to(tl.float32) - (x2 * s1).to(dt).to(tl.float32)
    o2 = (x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)
    tl.store(out + d, o1.to(dt), mask=mask)
    tl.store(out + half + d, o2.to(dt), mask=mask)
    if BLOCK_REST > 0:
        e = tl.arange(0, BLOCK_REST)[None, :] + 2 * half
        rmask = live & (e < head_dim)
        tl.store(out + e, tl.load(x_row + e, mask=rmask, other=0.0), mask=rmask)
