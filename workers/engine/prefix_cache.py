"""The prefix cache: K/V blocks of causal sequences, keyed by their token prefix, LRU-bounded in bytes.

``--prefix-cache-mb N`` (a model flag; 0 = off) keeps, per worker, the keys and
values (after RoPE, every layer) of each full block of ``BLOCK`` tokens a causal
model computed. A block's key is a chained hash: ``blake2b(parent key, its token
ids)``, so a key names the whole prefix up to the block's end; the cache belongs to
one runner (one model, one dtype). ``plan`` (the runner's prepare) walks each
eligible sequence's blocks: a block held in the cache, or computed by an earlier
sequence of the same batch (a rerank call's documents behind one shared query),
is skipped as long as every block before it is; at least the last token is always
computed (it is what LAST pools). The runner then packs only the rows after each
sequence's skipped prefix (``workers.models.prefix``) and ``store`` keeps the
newly computed blocks after the forward. Entries go least-recently-used first
while their bytes exceed the bound; a hit touches a sequence's blocks last to
first, so a prefix's head outlives its tail.

Exact only where a token's hidden state never depends on later tokens, and
useful only where the pooler reads no skipped row: causal attention, and tasks
that pool LAST (embed, classify, score of vLLM's LAST-pooled decoders). Every other
sequence (MEAN/CLS, ALL/STEP token tasks, a task or LoRA adapter, a PyLate attention mask)
runs whole and is neither read nor stored (vLLM's ``skip_reading_prefix_cache``);
a bidirectional model gets no cache at all (``for_model``, which says so in the log).
``stats`` (tokens looked up, tokens read from the cache, tokens shared within a
batch, blocks, bytes) goes out in the worker's ``health`` answer.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from poolgate.workers.models.prefix import PrefixPlan
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.pooling.dispatch import DispatchPooler

log = logging.getLogger(__name__)
BLOCK = 16  # tokens per block (workers/tools/bench_prefix.py measured 16, 32 and 64; docs/operations.md)


@dataclass
class Skips:
    """A batch's plan on the host: each sequence's skipped prefix length and the attention's layout."""

    skips: list[int]
    plan: PrefixPlan | None  # None: nothing skipped and nothing to store


class PrefixCache:
    """Block K/V of one causal model in one dtype, bounded by ``max_bytes``; both runner threads use it."""

    def __init__(self, pooler: DispatchPooler, max_bytes: int, *, block: int = BLOCK, group_attention: bool = True,
                 block_bytes: int | None = None):
        self.pooler, self.max_bytes, self.block, self.group_attention = pooler, max_bytes, block, group_attention
        # a batch captures at most the blocks the bound holds (its first ones), so storing never holds
        # more than a few times the bound at once; None: every new block (the bound then applies on store)
        self.most_captured = max_bytes // block_bytes if block_bytes else None
        self._table: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # key → (layers, 2, block, kv_heads, d)
        self._lock = threading.Lock()
        self.looked_up = self.hit = self.shared = self.bytes = 0

    def eligible(self, seq: Sequence) -> bool:
        """Whether a cache hit leaves this sequence's outputs as they are: every output pools LAST."""
        p = seq.params
        if seq.attend is not None or p.adapter is not None or p.lora is not None or p.sparse:  # other weights' K/V
            return False
        for out in p.all_outputs():
            pooler = self.pooler.poolers.get(out.task)
            if pooler is None or pooler.pool is not None or pooler.method != "LAST":
                return False
        return True

    def keys(self, ids: list[int]) -> list[bytes]:
        """The chained key of each full block of ``ids``."""
        arr, keys, parent = np.asarray(ids, dtype=np.int64), [], b""
        for b in range(len(ids) // self.block):
            tokens = arr[b * self.block:(b + 1) * self.block].tobytes()
            parent = hashlib.blake2b(parent + tokens, digest_size=16).digest()
            keys.append(parent)
        return keys

    def plan(self, seqs: list[Sequence]) -> Skips:
        """Look every eligible sequence up; the skipped prefixes and, where any, the layout that runs them."""
        bk = self.block
        skips = [0] * len(seqs)
        if any(s.attend is not None for s in seqs):  # keys masked per sequence: the batch runs as it is
            return Skips(skips, None)
        cached: list[tuple[int, torch.Tensor]] = []  # (first row in full, block)
        shared: list[tuple[int, int]] = []  # (first row in full, first new row it copies)
        capture: list[int] = []  # first new row of each block to store
        keys_out: list[bytes] = []
        read: list[list[bytes]] = []  # per sequence, the keys of the blocks it read from the cache
        made: dict[bytes, int] = {}  # key → first new row of a block this batch computes
        full_at = new_at = 0
        looked = 0
        with self._lock:
            for i, seq in enumerate(seqs):
                n = seq.num_tokens
                keys = self.keys(seq.token_ids) if self.eligible(seq) else []
                looked += n if keys else 0
                most, skip, touched = (n - 1) // bk, 0, []
                for b, key in enumerate(keys):
                    block, reusable = self._table.get(key), skip == b * bk and b < most  # every block before reused
                    if reusable and block is not None:
                        cached.append((full_at + b * bk, block))
                        touched.append(key)
                    elif reusable and key in made:
                        shared.append((full_at + b * bk, made[key]))
                    else:
                        if block is None and key not in made:
                            made[key] = new_at + b * bk - skip
                            if self.most_captured is None or len(capture) < self.most_captured:
                                capture.append(made[key])
                                keys_out.append(key)
                        continue
                    skip += bk
                for key in reversed(touched):  # the tail first: the head ends up the most recent
                    self._table.move_to_end(key)
                read.append(touched)
                skips[i] = skip
                full_at, new_at = full_at + n, new_at + n - skip
            self.looked_up += looked
            self.hit += bk * len(cached)
            self.shared += bk * len(shared)
        if not capture and not any(skips):
            return Skips(skips, None)
        plan = self._layout(seqs, skips, cached, shared, capture, keys_out)
        plan.read = list(dict.fromkeys(key for seq_keys in read for key in seq_keys))
        return Skips(skips, plan)

    def _layout(self, seqs: list[Sequence], skips: list[int], cached: list[tuple[int, torch.Tensor]],
                shared: list[tuple[int, int]], capture: list[int], keys: list[bytes]) -> PrefixPlan:
        from poolgate.workers.batch.packing import pack

        bk = self.block
        span = np.arange(bk, dtype=np.int64)

        def rows(starts: list[int]) -> torch.Tensor | None:
            if not starts:
                return None
            return torch.from_numpy((np.asarray(starts, dtype=np.int64)[:, None] + span).reshape(-1))

        cap = rows(capture)
        if not any(skips):
            return PrefixPlan(None, None, capture=cap, keys=keys)
        lengths = np.array([s.num_tokens for s in seqs], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        new_rows = np.concatenate([np.arange(st + sk, st + n) for st, sk, n in zip(starts, skips, lengths)])
        shared_src = rows([src for _, src in shared])
        full = pack([s.token_ids for s in seqs], group_attention=self.group_attention)
        return PrefixPlan(
            full, torch.from_numpy(new_rows), cached_rows=rows([at for at, _ in cached]),
            cached=torch.cat([blk for _, blk in cached], dim=2) if cached else None,
            shared_rows=rows([at for at, _ in shared]), shared_src=shared_src, capture=cap, keys=keys)

    def store(self, plan: PrefixPlan) -> None:
        """Keep the blocks the forward computed (``plan.kept``: per layer, the captured rows' k and v).

        Blocks come in batch order (a shared head first); only as many as the bound holds are kept, the
        first ones, and they and then the blocks the batch read go in last to first: the batch's heads
        are the most recent entries when older ones are evicted."""
        blocks: list[tuple[bytes, torch.Tensor]] = []
        if plan.kept:
            kv = torch.stack([torch.stack(pair) for pair in plan.kept])  # (layers, 2, n_capture, kv_heads, d)
            blocks = list(zip(plan.keys, kv.split(self.block, dim=2)))
            plan.kept.clear()
        size = blocks[0][1].nbytes if blocks else 0
        blocks = blocks[:self.max_bytes // size] if size else []
        with self._lock:
            for key, block in reversed(blocks):
                if key not in self._table:
                    self._table[key] = block.clone()  # its own storage: an evicted block frees its bytes
                    self.bytes += size
                self._table.move_to_end(key)
            for key in reversed(plan.read):
                if key in self._table:
                    self._table.move_to_end(key)
            while self.bytes > self.max_bytes and self._table:
                _, old = self._table.popitem(last=False)
                self.bytes -= old.nbytes

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"looked_up_tokens": self.looked_up, "hit_tokens": self.hit, "shared_tokens": self.shared,
                    "blocks": len(self._table), "bytes": self.bytes}


def for_model(model: torch.nn.Module, pooler: DispatchPooler, max_bytes: int, *, dtype: torch.dtype,
              group_attention: bool) -> PrefixCache | None:
    """The cache for a packed causal decoder; None (and why, in the log) for anything else."""
    if max_bytes <= 0:
        return None
    config = getattr(model, "config", None)
    if not getattr(model, "supports_prefix", False) or config is None:
        log.info("prefix cache off: %s is not a packed causal decoder", type(model).__name__)
        return None
    if not config.causal:
        log.info("prefix cache off: bidirectional attention (a token's state depends on later tokens)")
        return None
    if not any(p.method == "LAST" and p.pool is None for p in pooler.poolers.values()):
        log.info("prefix cache off: no task of this model pools LAST")
        return None
    log.info("prefix cache: up to %d MB of K/V in blocks of %d tokens, for LAST-pooled tasks", max_bytes >> 20, BLOCK)
    size = config.num_hidden_layers * 2 * BLOCK * config.num_key_value_heads * config.head_dim * dtype.itemsize
    return PrefixCache(pooler, max_bytes, group_attention=group_attention, block_bytes=size)
