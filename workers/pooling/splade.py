"""SPLADE sparse embeddings: the MLM head over every token, ``log1p(relu(logits))``, max over the sequence.

A ``BertForMaskedLM`` checkpoint served with the architecture
``BertSpladeSparseEmbeddingModel`` (vLLM's name; ``--hf-overrides
'{"architectures": ["BertSpladeSparseEmbeddingModel"]}'``) embeds into a
vocabulary-size vector: the MLM head (transform dense → GELU → LayerNorm →
decoder tied to the word embeddings, plus bias) turns each token into vocab
logits, ``log1p(relu(·))`` makes them non-negative weights, CLS and SEP are
left out, and each sequence keeps the max per vocabulary entry. Tokens go
through the head in chunks, so a batch never holds ``n_tokens × vocab`` at once.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from poolgate.workers.batch.packing import PackedBatch
from poolgate.workers.load.checkpoint import find_name
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import RawHead
from poolgate.workers.pooling.sources import PoolerSources

CHUNK_TOKENS = 512
PREFIX = "cls.predictions."


def _tensor(state: Mapping[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """``name`` in fp32 (a LayerNorm's old gamma/beta name too), or None if the checkpoint lacks it."""
    found = find_name(state, name)
    return None if found is None else state[found].float()


class MlmHead(nn.Module):
    """(tokens, hidden) → (tokens, vocab) logits, transformers' BertOnlyMLMHead in fp32."""

    def __init__(self, state: Mapping[str, torch.Tensor], eps: float):
        """``state``: the checkpoint with its base prefix (``bert.``) dropped; only the head's tensors are read."""
        super().__init__()
        dense = _tensor(state, f"{PREFIX}transform.dense.weight")
        self.dense = nn.Linear(dense.shape[1], dense.shape[0])
        self.dense.load_state_dict({"weight": dense, "bias": _tensor(state, f"{PREFIX}transform.dense.bias")})
        self.norm = nn.LayerNorm(dense.shape[0], eps=eps)
        norm = {k: _tensor(state, f"{PREFIX}transform.LayerNorm.{k}") for k in ("weight", "bias")}
        self.norm.load_state_dict(norm)
        tied = _tensor(state, f"{PREFIX}decoder.weight")
        tied = _tensor(state, "embeddings.word_embeddings.weight") if tied is None else tied
        self.decoder = nn.Parameter(tied, requires_grad=False)  # (vocab, hidden)
        bias = _tensor(state, f"{PREFIX}bias")
        bias = _tensor(state, f"{PREFIX}decoder.bias") if bias is None else bias
        self.bias = nn.Parameter(torch.zeros(tied.shape[0]) if bias is None else bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(F.gelu(self.dense(x)))
        return F.linear(x, self.decoder, self.bias)


class SpladePool(nn.Module):
    """A sequence pooling method: (n_tokens, hidden) → (n_seqs, vocab) SPLADE weights."""

    def __init__(self, head: MlmHead, special_ids: tuple[int, ...]):
        super().__init__()
        self.head = head
        self.register_buffer("special", torch.tensor(special_ids, dtype=torch.long), persistent=False)

    def forward(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        n_seqs, vocab = len(batch.lengths), self.head.decoder.shape[0]
        out = hidden.new_zeros(n_seqs, vocab, dtype=torch.float32)  # (n_seqs, vocab); weights >= 0: 0 is the identity
        keep = ~torch.isin(batch.input_ids, self.special.to(batch.input_ids.device))  # (n_tokens,)
        for lo in range(0, hidden.shape[0], CHUNK_TOKENS):
            hi = min(lo + CHUNK_TOKENS, hidden.shape[0])
            weights = torch.log1p(torch.relu(self.head(hidden[lo:hi].float())))  # (chunk, vocab), fp32 head
            weights = weights * keep[lo:hi, None]
            index = batch.seg_ids[lo:hi, None].expand(-1, vocab)
            out.scatter_reduce_(0, index, weights, reduce="amax", include_self=True)
        return out


def splade_poolers(src: PoolerSources) -> DispatchPooler:
    """embed = SPLADE weights over the vocabulary (no normalization, no matryoshka); CLS and SEP left out."""
    tokenizer = src.the_tokenizer("SPLADE (which leaves CLS and SEP out)")
    special = tuple(i for i in (tokenizer.cls_token_id, tokenizer.sep_token_id) if i is not None)
    head = MlmHead(src.weights, src.spec.hf_config.get("layer_norm_eps", 1e-12))
    pool = SpladePool(head, special).to(src.device)
    return DispatchPooler({"embed": Pooler("SPLADE", RawHead(), pool)}, active=src.spec.pooler.task,
                          out_dim=int(head.decoder.shape[0]), ops=src.ops)
