"""Normalization modules of the ops bundle: LayerNorm (torch's; and with an in-place residual add) and RMSNorm
(Llama and Gemma styles)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x: (..., dim) → the same; fp32 inside; ``gemma`` = weight stored as an offset from 1.

    Llama-style ``w * x̂`` cast back, Gemma ``x̂ * (1 + w)`` then cast (as transformers computes them)."""

    def __init__(self, dim: int, eps: float, gemma: bool = False):
        super().__init__()
        self.eps, self.gemma = eps, gemma
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma:
            return (h * (1.0 + self.weight.float())).type_as(x)
        return self.weight * h.to(x.dtype)


class LayerNorm(nn.LayerNorm):
    """torch's LayerNorm (its ``weight``/``bias`` are the checkpoint's names) that also takes the residual:
    ``norm(x, residual)`` is ``norm(x + residual)``, the post-norm layer's add, so a backend can fuse the two.

    ``overwrite_x=True`` is the caller's leave to write the result over ``x`` (a sublayer's fresh output it
    no longer needs), which saves a fused kernel a fresh buffer; this reference does not take it up."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *,
                overwrite_x: bool = False) -> torch.Tensor:
        return super().forward(x if residual is None else x + residual)


class AddInPlaceLayerNorm(LayerNorm):
    """``LayerNorm`` that takes up ``overwrite_x`` for fp32 rows: the residual is added into ``x`` (no fresh
    buffer for the sum), then torch's LayerNorm; the same arithmetic as the reference, bit for bit. Measured
    on the bundled model's forward (fp32, AVX2 class): about 2% more tokens per CPU-second. Other dtypes,
    shapes or leave: the reference."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *,
                overwrite_x: bool = False) -> torch.Tensor:
        if (overwrite_x and residual is not None and x.dtype == torch.float32 and x.shape == residual.shape
                and x.is_contiguous()):
            return F.layer_norm(x.add_(residual), self.normalized_shape, self.weight, self.bias, self.eps)
        return super().forward(x, residual)


def add_in_place_layer_norm(dim: int, eps: float, bias: bool = True) -> nn.Module:
    """``AddInPlaceLayerNorm`` (the CPU backend's fp32 LayerNorm)."""
    return AddInPlaceLayerNorm(dim, eps=eps, bias=bias)


def layer_norm(dim: int, eps: float, bias: bool = True) -> nn.Module:
    """The reference LayerNorm (``LayerNorm``)."""
    return LayerNorm(dim, eps=eps, bias=bias)


def rms_norm(dim: int, eps: float, gemma: bool = False) -> nn.Module:
    return RMSNorm(dim, eps, gemma)
