"""Attention over packed sequences: varlen flash attention, or SDPA per length group."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from workers.packing import PackedBatch

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PackedBatch, float], torch.Tensor]


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch,
                 scale: float) -> torch.Tensor:
    """q, k, v: (n_tokens, heads, head_dim) → (n_tokens, heads, head_dim), exact.

    Each group of similar-length sequences is padded to its own longest and
    masked, so the padding cost stays within the plan's waste factor.
    """
    n_tokens, heads, dim = q.shape
    out = torch.empty_like(q)
    for g in batch.groups:
        def block(x: torch.Tensor) -> torch.Tensor:
            return x.index_select(0, g.gather).view(g.n, g.max_len, heads, dim).transpose(1, 2)

        o = F.scaled_dot_product_attention(block(q), block(k), block(v), attn_mask=g.mask, scale=scale)
        o = o.transpose(1, 2).reshape(g.n * g.max_len, heads, dim)  # (n * max_len, heads, dim)
        out.index_copy_(0, g.dst, o.index_select(0, g.valid))
    return out


def varlen_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch,
                 scale: float) -> torch.Tensor:
    """q, k, v: (n_tokens, heads, head_dim) fp16/bf16 on a GPU → same shape, no padding.

    The kernel's default softmax scale is 1/sqrt(head_dim); other scales go
    through the keyword that torch ≥ 2.11 has.
    """
    from torch.nn.attention.varlen import varlen_attn

    cu = batch.cu_seqlens
    kwargs = {} if abs(scale * q.shape[-1] ** 0.5 - 1.0) < 1e-6 else {"scale": scale}
    return varlen_attn(q, k, v, cu, cu, batch.max_len, batch.max_len, **kwargs)


def has_varlen() -> bool:
    """Whether this torch build ships ``torch.nn.attention.varlen`` (2.10+)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True
