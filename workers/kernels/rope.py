"""Rotary embeddings applied to packed q/k: the torch reference of the ``rope`` op (``kernels.ops``)."""
from __future__ import annotations

import torch


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (n_tokens, heads, head_dim) → the same, with the first ``rotary_dim`` dims rotated
    ("rotate halves", as transformers does); cos, sin: (n_tokens, 1, rotary_dim) fp32."""
    rot = cos.shape[-1]
    xr, rest = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)  # rotate_half
    out = xr * cos.to(x.dtype) + rotated * sin.to(x.dtype)
    return out if rest.shape[-1] == 0 else torch.cat([out, rest], dim=-1)
