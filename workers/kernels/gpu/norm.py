"""Residual add + LayerNorm, and RMSNorm (Llama and Gemma), as one Triton kernel each row (``jit.norm_rows``).

``TritonLayerNorm`` is the ops bundle's ``LayerNorm`` (the same ``weight`` and
``bias``, so checkpoints load as they do) and ``TritonRMSNorm`` its
``RMSNorm``; both take ``norm(x, residual)`` = ``norm(x + residual)`` with the
sum rounded to the input dtype as torch's add leaves it, fp32 statistics, and
one read of each input and one write. The RMSNorm keeps the reference's
casting order: Llama ``w * x̂`` with x̂ cast to the input dtype first, Gemma
``x̂ * (1 + w)`` in fp32 then cast. A layout the kernel does not take (not on a
GPU and not under the interpreter, rows wider than ``rows.MAX_DIM``, a last
dim with a stride, more than three dims, a weight in another dtype than the
input for LayerNorm) runs the reference.
"""
from __future__ import annotations

import torch

from poolgate.workers.kernels.gpu.rows import MAX_DIM, block, row_layout, rows_per_program, runs_here, warps
from poolgate.workers.kernels.norm import LayerNorm, RMSNorm


def _launch(x: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor, weight: torch.Tensor,
            bias: torch.Tensor | None, eps: float, *, rms: bool, gemma: bool) -> torch.Tensor:
    from poolgate.workers.kernels.gpu import jit

    lx, lo = row_layout(x), row_layout(out)
    lr = row_layout(residual) if residual is not None else (0, 0, 0, 0)
    assert lx and lo and lr, "the callers check the layouts (_takes)"
    (rows, heads, xs0, xs1), (_, _, rs0, rs1), (_, _, os0, os1) = lx, lr, lo
    dim = x.shape[-1]
    size, per = block(dim), rows_per_program(dim)
    if rows:
        jit.norm_rows[(-(-rows // per),)](x, xs0, xs1, x if residual is None else residual, rs0, rs1, out, os0,
                                          os1, weight, weight if bias is None else bias, rows, heads, dim,
                                          float(eps), RMS=rms, GEMMA=gemma, HAS_RES=residual is not None,
                                          HAS_BIAS=bias is not None, ROWS=per, BLOCK=size,
                                          num_warps=warps(per * size))
    return out


def _takes(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None) -> bool:
    """Whether the kernel takes these tensors (see the module docstring)."""
    dim = x.shape[-1]
    return (runs_here(x) and 0 < dim <= MAX_DIM and row_layout(x) is not None and weight is not None
            and weight.shape == (dim,) and weight.is_contiguous() and weight.device == x.device
            and (residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                      and residual.device == x.device and row_layout(residual) is not None)))


class TritonLayerNorm(LayerNorm):
    """``LayerNorm`` on ``jit.norm_rows`` where it applies; ``overwrite_x=True`` writes the result over ``x``
    (each row is read whole before it is written)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *,
                overwrite_x: bool = False) -> torch.Tensor:
        b = self.bias
        if not (_takes(x, residual, self.weight) and tuple(self.normalized_shape) == (x.shape[-1],)
                and self.weight.dtype == x.dtype and (b is None or (b.dtype == x.dtype and b.is_contiguous()))):
            return super().forward(x, residual)
        out = x if overwrite_x and x.is_contiguous() else torch.empty(x.shape, dtype=x.dtype, device=x.device)
        return _launch(x, residual, out, self.weight, b, self.eps, rms=False, gemma=False)


class TritonRMSNorm(RMSNorm):
    """``RMSNorm`` on ``jit.norm_rows`` where it applies; also takes a residual: ``norm(x, r)`` is
    ``norm(x + r)`` (the reference's ``forward`` takes ``x`` alone, so a model calls it so)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not _takes(x, residual, self.weight) or self.weight.dtype not in (torch.float32, torch.float16,
                                                                              torch.bfloat16):
            return super().forward(x if residual is None else x + residual)
        # Llama: the weight's dtype and the input's, promoted (as ``weight * x̂`` is); Gemma: the input's
        dtype = x.dtype if self.gemma else torch.promote_types(self.weight.dtype, x.dtype)
        out = torch.empty(x.shape, dtype=dtype, device=x.device)
        return _launch(x, residual, out, self.weight, None, self.eps, rms=True, gemma=self.gemma)


def triton_layer_norm(dim: int, eps: float, bias: bool = True) -> LayerNorm:
    return TritonLayerNorm(dim, eps=eps, bias=bias)


def triton_rms_norm(dim: int, eps: float, gemma: bool = False) -> RMSNorm:
    return TritonRMSNorm(dim, eps, gemma)
