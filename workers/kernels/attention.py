"""Attention over packed sequences: varlen flash attention, or SDPA per length group."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from poolgate.workers.packing import PackedBatch

AttentionFn = Callable[[torch.Tensor, PackedBatch, float], torch.Tensor]


def grouped_sdpa(qkv: torch.Tensor, batch: PackedBatch, scale: float) -> torch.Tensor:
    """qkv: (n_tokens, 3, heads, head_dim) → (n_tokens, heads, head_dim), exact.

    Each group of similar-length sequences is gathered (one contiguous row
    copy), padded to its own longest and masked, so the padding cost stays
    within the plan's waste factor.
    """
    n_tokens, _, heads, dim = qkv.shape
    out = qkv.new_empty(n_tokens, heads, dim)
    for g in batch.groups:
        block = qkv.index_select(0, g.gather).view(g.n, g.max_len, 3, heads, dim)
        q, k, v = block.permute(2, 0, 3, 1, 4).unbind(0)  # 3 × (n, heads, max_len, dim)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=g.mask, scale=scale)
        o = o.transpose(1, 2).reshape(g.n * g.max_len, heads, dim)  # (n * max_len, heads, dim)
        out.index_copy_(0, g.dst, o if g.mask is None else o.index_select(0, g.valid))
    return out


def varlen_flash(qkv: torch.Tensor, batch: PackedBatch, scale: float) -> torch.Tensor:
    """qkv: (n_tokens, 3, heads, head_dim) fp16/bf16 on a GPU → (n_tokens, heads, head_dim).

    No padding at all. The kernel's default softmax scale is 1/sqrt(head_dim);
    other scales go through the keyword that torch ≥ 2.11 has.
    """
    from torch.nn.attention.varlen import varlen_attn

    q, k, v = qkv.unbind(1)  # 3 × (n_tokens, heads, dim)
    cu = batch.cu_seqlens
    kwargs = {} if abs(scale * qkv.shape[-1] ** 0.5 - 1.0) < 1e-6 else {"scale": scale}
    return varlen_attn(q, k, v, cu, cu, batch.max_len, batch.max_len, **kwargs)


def has_varlen() -> bool:
    """Whether this torch build ships ``torch.nn.attention.varlen`` (2.10+)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True
