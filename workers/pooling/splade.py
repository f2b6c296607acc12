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

import torch
import torch.nn.functional as F
from torch import nn

from poolgate.workers.engine.packing import PackedBatch
from poolgate.workers.load.weights import strip_prefix

CHUNK_TOKENS = 512
PREFIX = "cls.predictions."
LEGACY = {"weight": "gamma", "bias": "beta"}  # old TF LayerNorm names


def _norm_param(state: dict[str, torch.Tensor], kind: str) -> torch.Tensor:
    name = f"{PREFIX}transform.LayerNorm.{kind}"
    return state[name] if name in state else state[f"{PREFIX}transform.LayerNorm.{LEGACY[kind]}"]


class MlmHead(nn.Module):
    """(tokens, hidden) → (tokens, vocab) logits, transformers' BertOnlyMLMHead in fp32."""

    def __init__(self, state: dict[str, torch.Tensor], eps: float):
        super().__init__()
        state = {k: v.float() for k, v in strip_prefix(state, ("bert.",)).items()}
        dense = state[f"{PREFIX}transform.dense.weight"]
        self.dense = nn.Linear(dense.shape[1], dense.shape[0])
        self.dense.load_state_dict({"weight": dense, "bias": state[f"{PREFIX}transform.dense.bias"]})
        self.norm = nn.LayerNorm(dense.shape[0], eps=eps)
        self.norm.load_state_dict({"weight": _norm_param(state, "weight"), "bias": _norm_param(state, "bias")})
        tied = state.get(f"{PREFIX}decoder.weight", state["embeddings.word_embeddings.weight"])
        self.decoder = nn.Parameter(tied, requires_grad=False)  # (vocab, hidden)
        bias = state.get(f"{PREFIX}bias", state.get(f"{PREFIX}decoder.bias"))
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
