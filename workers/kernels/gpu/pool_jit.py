"""The Triton kernels of ``pool`` and ``normalize`` (imported on their first launch, never at start).

``triton.jit`` decides at decoration whether a kernel is compiled or run by the
interpreter (``TRITON_INTERPRET``), so this module is imported only when
``pool`` or ``normalize`` launches its first kernel: a worker that never pools
with them never imports triton, and the interpreter tests set the variable
before that launch. The kernels call only triton's built-in operations:
``tl.sum`` and ``tl.zeros`` are functions jitted when triton is imported,
which the interpreter cannot call when that import was not under it, so sums
go through ``tl.reduce`` with triton's sum combiner and zeros are ``tl.full``.
Every load is widened to fp32 before any arithmetic.
"""
from __future__ import annotations

import triton
import triton.language as tl

_sum = tl.standard._sum_combine  # the interpreter sums with numpy for this combiner


@triton.jit
def pick_rows(src, index, out, cols, src_stride, out_stride, BLOCK: tl.constexpr):
    """out[i, c] = src[index[i], c], cast to out's dtype; grid (rows, column blocks)."""
    i = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < cols
    row = tl.load(index + i).to(tl.int64)
    x = tl.load(src + row * src_stride + c, mask=mask)
    tl.store(out + i.to(tl.int64) * out_stride + c, x.to(out.dtype.element_ty), mask=mask)


@triton.jit
def segment_mean(src, rows, bounds, out, cols, src_stride, out_stride, min_count,
                 BY_INDEX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
    """out[s] = the fp32 mean of segment s's rows: src[bounds[s]:bounds[s+1]], or with BY_INDEX the rows
    src[rows[bounds[s]:bounds[s+1]]]; divided by max(count, min_count); grid (segments, column blocks)."""
    s = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = c < cols
    lo = tl.load(bounds + s).to(tl.int64)
    hi = tl.load(bounds + s + 1).to(tl.int64)
    acc = tl.full((BLOCK,), 0.0, tl.float32)
    for start in range(lo, hi, BLOCK_R):
        r = start + tl.arange(0, BLOCK_R)
        rmask = r < hi
        if BY_INDEX:
            r = tl.load(rows + r, mask=rmask, other=0).to(tl.int64)
        x = tl.load(src + r[:, None] * src_stride + c[None, :], mask=rmask[:, None] & cmask[None, :], other=0.0)
        acc += tl.reduce(x.to(tl.float32), 0, _sum)
    count = tl.maximum((hi - lo).to(tl.float32), min_count)
    tl.store(out + s.to(tl.int64) * out_stride + c, acc / count, mask=cmask)


@triton.jit
def l2_cut(x, out, cols, x_stride, out_stride, eps, BLOCK: tl.constexpr):
    """out[r, :cols] = x[r, :cols] / max(||x[r, :cols]||, eps); grid (rows,)."""
    r = tl.program_id(0).to(tl.int64)
    squares = tl.full((BLOCK,), 0.0, tl.float32)
    for start in range(0, cols, BLOCK):
        c = start + tl.arange(0, BLOCK)
        v = tl.load(x + r * x_stride + c, mask=c < cols, other=0.0).to(tl.float32)
        squares += v * v
    norm = tl.maximum(tl.sqrt(tl.reduce(squares, 0, _sum)), eps)
    for start in range(0, cols, BLOCK):
        c = start + tl.arange(0, BLOCK)
        v = tl.load(x + r * x_stride + c, mask=c < cols, other=0.0).to(tl.float32)
        tl.store(out + r * out_stride + c, (v / norm).to(out.dtype.element_ty), mask=c < cols)
