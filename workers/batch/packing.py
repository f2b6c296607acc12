"""Turns a list of token-id lists into one packed, padding-free batch (host side)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch


@dataclass
class AttnGroup:
    """Sequences of similar length attended together, padded only inside the group."""

    n: int  # sequences in the group
    max_len: int
    gather: torch.Tensor  # (n * max_len,) token rows to read; padding reads row 0
    mask: torch.Tensor | None  # (n, 1, 1, max_len) True = real key a query may attend; None = no padding
    valid: torch.Tensor  # (n_tokens_in_group,) rows of the padded block that are real
    dst: torch.Tensor  # (n_tokens_in_group,) where those rows go in the packed output
    masks: dict = field(default_factory=dict, repr=False)  # attention masks built for this group, by kind
    rows: torch.Tensor | None = None  # (n, 1, max_len, 1) True = a real query row; only where keys are masked


@dataclass
class PackedBatch:
    """``input_ids``/``positions`` are (n_tokens,); ``cu_seqlens`` is (batch + 1,) int32.

    ``positions`` count from 0 in each sequence; a model's position scheme
    (``workers.models.positions``) adds any offset. ``token_type_ids`` is
    (n_tokens,) segment ids for cross-encoder pairs, or None (all zeros).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    seg_ids: torch.Tensor  # (n_tokens,) index of each token's sequence
    lengths: list[int]
    max_len: int
    groups: list[AttnGroup] | None = None
    token_type_ids: torch.Tensor | None = None
    run_rows: list[torch.Tensor | None] | None = None  # per run, the token rows its pooler keeps (planned in prepare)
    key_masked: bool = False  # some real tokens are keys no query attends (``pack(attend=...)``): grouped attention
    # per-request task adapters (workers.models.task_adapters): per adapter index, its token rows (None = all)
    adapter_rows: list[tuple[int, torch.Tensor | None]] | None = None
    # causal sequences that start from K/V computed elsewhere (workers.models.prefix); None = every row computed
    prefix: Any = None  # a workers.models.prefix.PrefixPlan (Any: that module builds on this one, not the reverse)
    # per sequence its processed images/clips (shared.wire.media.MediaItem; numpy, on the host), for a media model
    # (workers.models.media); None: a text batch
    media: list[Any] | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def pack(seqs: list[list[int]], *, token_types: list[list[int] | None] | None = None,
         attend: list[list[bool] | None] | None = None, group_attention: bool = True, waste: float = 1.1,
         max_group: int = 256, group_tokens: int = 8192) -> PackedBatch:
    """Concatenate ``seqs``; with ``group_attention`` also plan length-sorted SDPA groups.

    ``token_types`` gives each sequence's segment ids (same length as the
    sequence; None for a sequence means zeros); without any, the batch has none.
    ``attend`` gives each sequence's attention mask over its keys (False: no query attends that token,
    as a padded batch's ``attention_mask`` 0; PyLate's query expansion); None for a sequence means all.
    A batch with such keys is always planned in groups (their masks carry it) and marked ``key_masked``.
    """
    lengths = [len(s) for s in seqs]
    ids = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=sum(lengths))
    cu = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    starts = np.repeat(cu[:-1], lengths)
    positions = np.arange(ids.shape[0], dtype=np.int64) - starts
    seg_ids = np.repeat(np.arange(len(seqs), dtype=np.int64), lengths)
    keys = _keys(attend, lengths)  # (n_tokens,) bool, or None: every key attended
    return PackedBatch(
        input_ids=torch.from_numpy(ids),
        positions=torch.from_numpy(positions),
        cu_seqlens=torch.from_numpy(cu.astype(np.int32)),
        seg_ids=torch.from_numpy(seg_ids),
        lengths=lengths,
        max_len=max(lengths),
        groups=_plan_groups(lengths, cu, waste, max_group, group_tokens, keys)
        if group_attention or keys is not None else None,
        token_type_ids=_token_types(token_types, lengths),
        key_masked=keys is not None,
    )


def _keys(attend: list[list[bool] | None] | None, lengths: list[int]) -> np.ndarray | None:
    if attend is None or all(a is None or all(a) for a in attend):
        return None
    for i, (a, n) in enumerate(zip(attend, lengths)):
        if a is not None and len(a) != n:
            raise ValueError(f"sequence {i}: an attention mask of {len(a)} for {n} tokens")
    return np.fromiter((bool(x) for a, n in zip(attend, lengths) for x in (a if a is not None else [True] * n)),
                       dtype=bool, count=sum(lengths))


def _token_types(types: list[list[int] | None] | None, lengths: list[int]) -> torch.Tensor | None:
    if types is None or all(t is None for t in types):
        return None
    if len(types) != len(lengths):
        raise ValueError(f"token_types has {len(types)} entries for {len(lengths)} sequences")
    for i, (t, n) in enumerate(zip(types, lengths)):
        if t is not None and len(t) != n:
            raise ValueError(f"sequence {i}: {len(t)} token type ids for {n} tokens")
    flat = np.fromiter((x for t, n in zip(types, lengths) for x in (t if t is not None else [0] * n)),
                       dtype=np.int64, count=sum(lengths))
    return torch.from_numpy(flat)


def _plan_groups(lengths: list[int], cu: np.ndarray, waste: float, max_group: int,
                 group_tokens: int = 8192, keys: np.ndarray | None = None) -> list[AttnGroup]:
    """Greedy groups over length-sorted sequences, padded cost ≤ ``waste`` × exact cost.

    A group also holds at most ``max_group`` sequences and ``group_tokens``
    padded tokens (a longer sequence goes alone): many short sequences share
    few SDPA calls, long ones do not build huge blocks.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups, current, exact = [], [], 0
    for i in order:
        s = lengths[i]
        top = lengths[current[0]] if current else s
        if current and (len(current) >= max_group or (len(current) + 1) * top > group_tokens
                        or (len(current) + 1) * top * top > waste * (exact + s * s)):
            groups.append(_group(current, lengths, cu, keys))
            current, exact = [], 0
        current.append(i)
        exact += s * s
    if current:
        groups.append(_group(current, lengths, cu, keys))
    return groups


def _group(members: list[int], lengths: list[int], cu: np.ndarray, keys: np.ndarray | None = None) -> AttnGroup:
    n, top = len(members), lengths[members[0]]
    lens = np.array([lengths[i] for i in members])
    col = np.arange(top)
    real = col[None, :] < lens[:, None]  # (n, top)
    gather = np.where(real, cu[members][:, None] + col[None, :], 0)
    attended = real if keys is None else real & keys[gather]  # (n, top) keys a query may attend
    full = bool(attended.all())
    return AttnGroup(
        n=n, max_len=top,
        gather=torch.from_numpy(gather.reshape(-1)),
        mask=None if full else torch.from_numpy(attended[:, None, None, :].copy()),
        valid=torch.from_numpy(np.flatnonzero(real.reshape(-1))),
        dst=torch.from_numpy(gather.reshape(-1)[real.reshape(-1)]),
        rows=None if keys is None else torch.from_numpy(real[:, None, :, None].copy()),
    )


def padded_rows(batch: PackedBatch, rows: int) -> PackedBatch:
    """The model's input for ``batch`` run as ``rows`` token rows (a backend's token bucket, ``rows >= n_tokens``):
    ``rows - n_tokens`` rows of token 0 at position 0 in segment 0 after the real ones, in no sequence
    (``cu_seqlens``, the groups and every plan still end at the real rows). Row-wise layers carry them along;
    attention leaves them out; the runner drops their hidden states before pooling. No rows to add: ``batch``."""
    extra = rows - batch.n_tokens
    if extra < 0:
        raise ValueError(f"a bucket of {rows} rows for {batch.n_tokens} tokens")
    if extra == 0:
        return batch

    def grow(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros(extra)])

    types = None if batch.token_type_ids is None else grow(batch.token_type_ids)
    return replace(batch, input_ids=grow(batch.input_ids), positions=grow(batch.positions),
                   seg_ids=grow(batch.seg_ids), token_type_ids=types)


def map_tensors(batch: PackedBatch, fn) -> PackedBatch:
    """A copy of ``batch`` with ``fn`` applied to every tensor (device moves, pinning)."""
    groups = None if batch.groups is None else [
        AttnGroup(g.n, g.max_len, fn(g.gather), None if g.mask is None else fn(g.mask), fn(g.valid), fn(g.dst),
                  rows=None if g.rows is None else fn(g.rows))
        for g in batch.groups
    ]
    types = None if batch.token_type_ids is None else fn(batch.token_type_ids)
    rows = None if batch.run_rows is None else [None if r is None else fn(r) for r in batch.run_rows]
    adapters = None if batch.adapter_rows is None else [(t, None if r is None else fn(r))
                                                        for t, r in batch.adapter_rows]
    prefix = None if batch.prefix is None else batch.prefix.map(fn)
    return PackedBatch(fn(batch.input_ids), fn(batch.positions), fn(batch.cu_seqlens), fn(batch.seg_ids),
                       batch.lengths, batch.max_len, groups, types, rows, batch.key_masked, adapters, prefix,
                       batch.media)  # media stay numpy on the host: the media model moves what it reads


def tensors(batch: PackedBatch) -> list[torch.Tensor]:
    """Every tensor ``batch`` holds."""
    out = [batch.input_ids, batch.positions, batch.cu_seqlens, batch.seg_ids]
    if batch.token_type_ids is not None:
        out.append(batch.token_type_ids)
    for g in batch.groups or ():
        out += [t for t in (g.gather, g.mask, g.valid, g.dst, g.rows) if t is not None]
    out += [r for r in batch.run_rows or () if r is not None] + [r for _, r in batch.adapter_rows or ()
                                                                  if r is not None]
    if batch.prefix is not None:  # the prefix plan's indexes and whole-sequence batch (its cached K/V is the cache's)
        p = batch.prefix
        out += [t for t in (p.new_rows, p.cached_rows, p.shared_rows, p.shared_src, p.capture) if t is not None]
        out += tensors(p.full) if p.full is not None else []
    return out


def padded_ids(batch: PackedBatch, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's ids as a right-padded ``(batch, longest)`` long block filled with ``pad_id``, and its mask
    (True = a real token), for models that run transformers' own padded forward."""
    n, width = len(batch.lengths), batch.max_len
    device = batch.input_ids.device
    lengths = torch.tensor(batch.lengths, device=device)
    mask = torch.arange(width, device=device)[None, :] < lengths[:, None]  # (batch, width)
    ids = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    ids[mask] = batch.input_ids.long()
    return ids, mask


def to_device(batch: PackedBatch, device: torch.device) -> PackedBatch:
    """Copy every tensor of ``batch`` to ``device`` (non-blocking where the source is pinned)."""
    if device.type == "cpu":
        return batch
    return map_tensors(batch, lambda t: t.to(device, non_blocking=True))
