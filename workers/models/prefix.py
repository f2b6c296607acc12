"""A packed batch whose sequences start from K/V computed elsewhere (the prefix cache, or another row).

A causal sequence's keys and values at a token depend only on the tokens up to
it, so a sequence whose first ``P`` tokens were already run (a cached block, or
another sequence of the same batch with the same first tokens) computes only
its last ``len - P`` rows through the layers. The model's input batch holds
those rows (``positions`` start at ``P``); ``PrefixPlan.full`` is the batch of
whole sequences the attention sees. At each layer ``attend`` scatters the new
rows' q/k/v into the whole layout, fills the skipped rows' k/v from the cache
(``cached``, per layer) or from the batch's own new rows (``shared_src``), runs
the backend's attention over whole sequences (causal, windows and all, exactly
as without a cache; the skipped rows' queries are zeros and their outputs
dropped) and keeps the new rows' outputs. Rows named in ``capture`` keep their
k/v per layer in ``kept`` for the cache to store after the forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from poolgate.workers.batch.packing import PackedBatch, map_tensors


@dataclass
class PrefixPlan:
    """The host-planned layout of a batch with skipped prefixes (tensors as ``(rows,)`` int64 indexes)."""

    full: PackedBatch | None  # whole sequences, for attention; None: no sequence skips (same layout as the input)
    new_rows: torch.Tensor | None  # (n_new,) each computed row's row in ``full``
    cached_rows: torch.Tensor | None = None  # (n_cached,) rows of ``full`` whose k/v come from ``cached``
    cached: torch.Tensor | None = None  # (layers, 2, n_cached, kv_heads, head_dim) on the device already
    shared_rows: torch.Tensor | None = None  # (n_shared,) rows of ``full`` whose k/v are new rows of this batch
    shared_src: torch.Tensor | None = None  # (n_shared,) the new row each copies
    capture: torch.Tensor | None = None  # (n_capture,) new rows whose k/v the cache stores
    keys: list[bytes] = field(default_factory=list)  # the captured blocks' keys, in row order
    read: list[bytes] = field(default_factory=list)  # keys of the cached blocks the batch reads, in batch order
    kept: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per layer (k, v) of ``capture``
    chunks: list[Any] = field(default_factory=list)  # chunked prefill: the inputs ``capture`` holds, in row order

    @property
    def exact_rows(self) -> bool:
        """Whether the model's input rows are exactly the layout's (a token bucket may then add rows)."""
        return self.full is None

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> PrefixPlan:
        """A copy with ``fn`` applied to the host-made tensors (``cached`` lives on the device; ``kept`` is shared)."""
        def opt(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else fn(t)

        return replace(self, full=None if self.full is None else map_tensors(self.full, fn),
                       new_rows=opt(self.new_rows), cached_rows=opt(self.cached_rows),
                       shared_rows=opt(self.shared_rows),
                       shared_src=opt(self.shared_src), capture=opt(self.capture))

    def keep(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> None:
        """Keep this layer's k/v of the ``capture`` rows (for the cache to store after the forward)."""
        if self.capture is not None:
            if layer == 0:  # a batch run again (after an out-of-memory split) starts over
                self.kept.clear()
            self.kept.append((k.index_select(0, self.capture), v.index_select(0, self.capture)))

    def attend(self, attention: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               batch: PackedBatch, layer: int, **kw: Any) -> torch.Tensor:
        """The new rows' attention: q (n_new, heads, d), k/v (n_new, kv_heads, d) → (n_new, heads, d)."""
        self.keep(k, v, layer)
        if self.full is None:
            return attention(q, k, v, batch, **kw)
        assert self.new_rows is not None
        n = self.full.n_tokens
        qf = q.new_zeros(n, *q.shape[1:])  # (n_full, heads, d)
        qf.index_copy_(0, self.new_rows, q)
        kf, vf = k.new_empty(n, *k.shape[1:]), v.new_empty(n, *v.shape[1:])  # (n_full, kv_heads, d)
        for full, new, i in ((kf, k, 0), (vf, v, 1)):
            full.index_copy_(0, self.new_rows, new)
            if self.cached is not None and self.cached_rows is not None:
                full.index_copy_(0, self.cached_rows, self.cached[layer, i])
            if self.shared_rows is not None and self.shared_src is not None:
                full.index_copy_(0, self.shared_rows, new.index_select(0, self.shared_src))
        return attention(qf, kf, vf, self.full, **kw).index_select(0, self.new_rows)  # (n_new, heads, d)
