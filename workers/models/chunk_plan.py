"""The layout of a batch that holds chunks of long inputs (``workers.engine.chunked_prefill``).

A chunk's rows are queries at positions ``P .. P + n`` of its input, whose keys
and values before ``P`` are kept (``known``, per layer). Running them through the
whole-sequence layout (``PrefixPlan.full``, as prefix-cache hits run) would cost
the attention of ``P + n`` queries; here each chunk's ``n`` queries attend to
[known ; its own] keys directly, the mask the ``(P + n)``-square one's last ``n``
rows (causal, the window's left and right reach, a soft cap as the model asks),
by SDPA (the soft cap: scores in fp32, as ``kernels.attention._softcapped``). The
other sequences of the batch (``rest``, whole) go through the backend's attention
as in any batch. Rows named in ``capture`` keep their k/v per layer in ``kept``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F

from poolgate.workers.batch.packing import PackedBatch, map_tensors
from poolgate.workers.models.prefix import PrefixPlan


@dataclass
class ChunkSpan:
    """One chunk in the batch's rows: its first row, its rows, its start in the input and the K/V before it."""

    at: int
    n: int
    start: int
    known: torch.Tensor | None  # (layers, 2, start, kv_heads, d) on the device; None when start == 0


@dataclass
class ChunkPlan(PrefixPlan):
    rest: PackedBatch | None = None  # the batch's other sequences, whole
    rest_rows: torch.Tensor | None = None  # (n_rest,) their rows in the batch
    spans: list[ChunkSpan] = field(default_factory=list)

    @property
    def exact_rows(self) -> bool:
        return False  # rows the plan does not name (a token bucket's) would get no attention output

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ChunkPlan:
        out = super().map(fn)
        assert isinstance(out, ChunkPlan)
        return replace(out, rest=None if self.rest is None else map_tensors(self.rest, fn),
                       rest_rows=None if self.rest_rows is None else fn(self.rest_rows))

    def attend(self, attention: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               batch: PackedBatch, layer: int, **kw: Any) -> torch.Tensor:
        """q (n_rows, heads, d), k/v (n_rows, kv_heads, d) → (n_rows, heads, d)."""
        self.keep(k, v, layer)
        out = q.new_zeros(q.shape[0], q.shape[1], v.shape[-1])
        if self.rest is not None and self.rest_rows is not None:
            r = self.rest_rows
            out.index_copy_(0, r, attention(q.index_select(0, r), k.index_select(0, r), v.index_select(0, r),
                                            self.rest, **kw))
        for s in self.spans:
            ks, vs = k[s.at:s.at + s.n], v[s.at:s.at + s.n]
            if s.known is not None:
                ks, vs = torch.cat([s.known[layer, 0], ks]), torch.cat([s.known[layer, 1], vs])
            out[s.at:s.at + s.n] = chunk_attention(q[s.at:s.at + s.n], ks, vs, s.start, **kw)
        return out


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, *, scale: float,
                    causal: bool = False, window: tuple[int, int] | None = None, bias: Any = None,
                    softcap: float | None = None) -> torch.Tensor:
    """Queries at positions ``start ..`` (n, heads, d) over keys at ``0 ..`` (start + n, kv_heads, d)."""
    assert bias is None, "a relative bias is an encoder's; chunked prefill runs causal decoders"
    n, m = q.shape[0], k.shape[0]
    i = torch.arange(start, start + n, device=q.device)[:, None]
    j = torch.arange(m, device=q.device)[None, :]
    ok = torch.ones(n, m, dtype=torch.bool, device=q.device)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= (j >= i - window[0]) & (j <= i + window[1])
    qb, kb, vb = (x.transpose(0, 1)[None] for x in (q, k, v))  # (1, h, L, d)
    if softcap is not None:
        group = qb.shape[1] // kb.shape[1]
        kb, vb = kb.repeat_interleave(group, dim=1), vb.repeat_interleave(group, dim=1)
        scores = torch.tanh((qb.float() @ kb.float().transpose(-1, -2)) * scale / softcap) * softcap
        o = scores.masked_fill(~ok, float("-inf")).softmax(-1).to(vb.dtype) @ vb
    else:
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=ok, scale=scale, enable_gqa=kb.shape[1] != qb.shape[1])
    return o[0].transpose(0, 1)  # (n, heads, d)
