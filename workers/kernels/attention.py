"""Attention over packed sequences: one contract, a grouped-SDPA path and a varlen flash path.

Every backend returns a function with the signature of ``AttentionFn``::

    attention(q, k, v, batch, *, scale, causal=False, window=None, bias=None, softcap=None)

q is (n_tokens, heads, head_dim); k and v are (n_tokens, kv_heads, head_dim)
with ``heads % kv_heads == 0`` (grouped-query attention); the result is
(n_tokens, heads, head_dim). A token attends only to keys of its own packed
sequence; ``causal`` keeps keys at or before it; ``window=(left, right)``
keeps key j for query i only if ``i - left <= j <= i + right`` (positions
within the sequence); ``bias`` adds a relative-position bias (MPNet) that
depends only on ``j - i``; ``softcap`` turns the scaled scores ``s`` into
``cap * tanh(s / cap)`` before the softmax (Gemma 2), in fp32.

``grouped_sdpa`` reads the batch's plan of similar-length groups
(``packing.AttnGroup``, made when the batch is packed in the runner's
``prepare``, never here), gathers each group into a padded block, builds the
group's mask once (padding keys, causal, window, bias) and runs one SDPA call
per group (soft-capped groups: one explicit fp32 softmax per group).
``varlen_flash`` runs without any padding; it expresses causal, windows and
GQA, and hands calls with a bias or a soft cap to ``grouped_sdpa``.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from poolgate.workers.batch.packing import AttnGroup, PackedBatch


class RelativeBias(Protocol):
    """An additive attention bias that depends only on the relative position ``j - i``."""

    def block(self, length: int) -> torch.Tensor:
        """(heads, length, length) float bias for a sequence at positions 0 .. length-1."""


class AttentionFn(Protocol):
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, *,
                 scale: float, causal: bool = False, window: tuple[int, int] | None = None,
                 bias: RelativeBias | None = None, softcap: float | None = None) -> torch.Tensor: ...


def allowed(length: int, *, causal: bool, window: tuple[int, int] | None,
            device: torch.device | None = None) -> torch.Tensor | None:
    """(length, length) bool, True where query i may attend key j; None = everything allowed."""
    if not causal and window is None:
        return None
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    ok = torch.ones(length, length, dtype=torch.bool, device=device)
    if causal:
        ok &= j <= i
    if window is not None:
        left, right = window
        ok &= (j >= i - left) & (j <= i + right)
    return ok


def _group_mask(g: AttnGroup, causal: bool, window: tuple[int, int] | None, bias: RelativeBias | None,
                dtype: torch.dtype) -> torch.Tensor | None:
    """The SDPA mask of one group: bool (n|1, 1, L|1, L), or float with the bias (n|1, heads|1, L, L).

    Padded query rows always keep their own (padding) key, so no row is fully
    masked (no NaN); their outputs are dropped anyway. A real row never gains a key its mask
    leaves out (``AttnGroup.rows``: a batch packed with ``attend``).
    """
    key = (causal, window, id(bias), dtype)
    if key in g.masks:
        return g.masks[key][0]
    device = g.gather.device
    rule = allowed(g.max_len, causal=causal, window=window, device=device)  # (L, L) or None
    mask = g.mask  # (n, 1, 1, L) real keys, or None
    if rule is not None:
        rule = rule[None, None]  # (1, 1, L, L)
        if mask is not None:
            diag = torch.eye(g.max_len, dtype=torch.bool, device=device)[None, None]
            if g.rows is not None:  # only padded rows keep their own key
                diag = diag & ~g.rows  # (n, 1, L, L)
            rule = rule & (mask | diag)  # (n, 1, L, L)
        mask = rule
    if bias is not None:
        b = bias.block(g.max_len).to(dtype)[None]  # (1, heads, L, L)
        mask = b if mask is None else b.masked_fill(~mask, float("-inf"))
    g.masks[key] = (mask, bias)  # kept for the batch's other layers; holding bias keeps its id unique
    return mask


def _fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """(n_tokens, 3, heads, d) view of q, k, v when they are the three slices of one fused QKV
    projection (``qkv.view(n, 3, h, d).unbind(1)``), so a group is gathered in one copy; else None."""
    step = q.shape[1] * q.shape[2]
    if not (q.shape == k.shape == v.shape and q.stride() == k.stride() == v.stride() and q.stride(1) == q.shape[2]
            and q.stride(2) == 1 and q.stride(0) >= 3 * step and q.device == k.device == v.device
            and q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
            and k.storage_offset() - q.storage_offset() == step and v.storage_offset() - k.storage_offset() == step):
        return None
    return q.as_strided((q.shape[0], 3, q.shape[1], q.shape[2]), (q.stride(0), step, q.stride(1), 1))


def planned_groups(batch: PackedBatch) -> list[AttnGroup]:
    """The batch's SDPA group plan; a batch packed without one is a bug in the caller (the runner plans it)."""
    if batch.groups is None:
        raise RuntimeError("grouped attention needs the batch's group plan, made when it is packed "
                           "(pack(..., group_attention=True), as the runner's prepare does)")
    return batch.groups


def _softcapped(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, mask: torch.Tensor | None, *,
                scale: float, cap: float) -> torch.Tensor:
    """SDPA with ``cap * tanh(s / cap)`` on the scaled scores, fp32 inside; (n, h, L, d) blocks, k/v GQA-repeated."""
    group = qb.shape[1] // kb.shape[1]
    kb, vb = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
    scores = (qb.float() @ kb.float().transpose(-1, -2)) * scale  # (n, heads, L, L)
    scores = torch.tanh(scores / cap) * cap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    return scores.softmax(-1).to(vb.dtype) @ vb  # (n, heads, L, d)


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, *, scale: float,
                 causal: bool = False, window: tuple[int, int] | None = None,
                 bias: RelativeBias | None = None, softcap: float | None = None) -> torch.Tensor:
    """Exact attention by SDPA per length group; padding stays within the plan's waste factor."""
    n_tokens, heads, dim = q.shape
    kv_heads = k.shape[1]
    out = q.new_empty(n_tokens, heads, v.shape[-1])
    fused = _fused(q, k, v)
    for g in planned_groups(batch):
        def block(x: torch.Tensor) -> torch.Tensor:  # (n_tokens, h, d) → (n, h, L, d)
            return x.index_select(0, g.gather).view(g.n, g.max_len, x.shape[1], x.shape[2]).transpose(1, 2)

        if fused is not None:  # one gather: (n * L, 3, h, d) → 3 × (n, h, L, d)
            qb, kb, vb = fused.index_select(0, g.gather).view(g.n, g.max_len, 3, heads, dim).permute(2, 0, 3, 1, 4)
        else:
            qb, kb, vb = block(q), block(k), block(v)
        mask = _group_mask(g, causal, window, bias, q.dtype)
        if softcap is not None:
            o = _softcapped(qb, kb, vb, mask, scale=scale, cap=softcap)
        else:
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale,
                                               enable_gqa=kv_heads != heads)  # (n, heads, L, d)
        o = o.transpose(1, 2).reshape(g.n * g.max_len, heads, -1)  # (n * L, heads, d)
        out.index_copy_(0, g.dst, o if g.mask is None else o.index_select(0, g.valid))
    return out


def varlen_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, *, scale: float,
                 causal: bool = False, window: tuple[int, int] | None = None,
                 bias: RelativeBias | None = None, softcap: float | None = None) -> torch.Tensor:
    """fp16/bf16 on a GPU, no padding; a bias, a soft cap or masked keys (``PackedBatch.key_masked``) go
    through ``grouped_sdpa`` instead."""
    if bias is not None or softcap is not None or batch.key_masked:
        return grouped_sdpa(q, k, v, batch, scale=scale, causal=causal, window=window, bias=bias, softcap=softcap)
    from torch.nn.attention.varlen import varlen_attn

    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    cu = batch.cu_seqlens
    return varlen_attn(q, k, v, cu, cu, batch.max_len, batch.max_len, scale=scale,
                       window_size=(left, right), enable_gqa=k.shape[1] != q.shape[1])


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, *,
                        scale: float, causal: bool = False, window: tuple[int, int] | None = None,
                        bias: RelativeBias | None = None, softcap: float | None = None) -> torch.Tensor:
    """The contract written plainly, one sequence at a time in fp32 (tests and agreement checks only)."""
    out = []
    group = q.shape[1] // k.shape[1]
    for s, e in zip(batch.cu_seqlens[:-1].tolist(), batch.cu_seqlens[1:].tolist()):
        qs = q[s:e].float().transpose(0, 1)  # (heads, len, d)
        ks = k[s:e].float().repeat_interleave(group, 1).transpose(0, 1)
        vs = v[s:e].float().repeat_interleave(group, 1).transpose(0, 1)
        scores = qs @ ks.transpose(1, 2) * scale  # (heads, len, len)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if bias is not None:
            scores = scores + bias.block(e - s).float()
        rule = allowed(e - s, causal=causal, window=window, device=q.device)
        if rule is not None:
            scores = scores.masked_fill(~rule, float("-inf"))
        out.append((scores.softmax(-1) @ vs).transpose(0, 1).to(q.dtype))  # (len, heads, d)
    rest = q.shape[0] - int(batch.cu_seqlens[-1])  # rows of a padded token bucket are no sequence's: zeros
    out.append(q.new_zeros(rest, q.shape[1], v.shape[-1]))
    return torch.cat(out)


def has_varlen() -> bool:
    """Whether this torch build ships ``torch.nn.attention.varlen`` (2.10+)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True
