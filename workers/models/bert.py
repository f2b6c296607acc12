"""A packed, padding-free BERT-family encoder (BERT, RoBERTa, XLM-R, CamemBERT) in one file.

All tokens of a batch run as one ``(n_tokens, hidden)`` matrix through the
linear layers; only attention sees sequence boundaries (``PackedBatch``).
Learned absolute positions (with RoBERTa's pad offset) come from
``models.positions``; token type ids are embedded when the batch has them
(cross-encoder pairs), else segment 0. Weight names follow transformers'
``BertModel``; the map in ``weight_names`` is explicit and Q/K/V are fused.
Linears, norms and attention come from the backend's ops bundle (``kernels.ops``).
The heads (pooler + classifier, RoBERTa's classifier, the MLM head for
SPLADE) are loaded by the poolers (``models.score``, ``pooling.splade``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from poolgate.workers.kernels.attention import RelativeBias
from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models.base import EMBEDDING_NAMES, Family, layer_names, load_mapped
from poolgate.workers.models.positions import LearnedPositions, learned_offset
from poolgate.workers.batch.packing import PackedBatch

BASE_PREFIXES = ("bert.", "roberta.", "xlm-roberta.", "camembert.", "model.")
HEAD_PREFIXES = ("cls.", "lm_head.", "classifier.", "pooler.", "colbert_linear.", "sparse_linear.")


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    position_offset: int

    @classmethod
    def from_hf(cls, hf: dict) -> "BertConfig":
        return cls(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"], max_position_embeddings=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2), layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            hidden_act=hf.get("hidden_act", "gelu"), position_offset=learned_offset(hf),
        )


class BertLayer(nn.Module):
    """Post-norm layer: ``x = norm(x + attn(x)); x = norm(x + down(act(up(x))))`` (BERT, DistilBERT, MPNet)."""

    def __init__(self, c: BertConfig, ops: Ops):
        super().__init__()
        self.heads, self.head_dim, self.attention = c.num_attention_heads, c.hidden_size // c.num_attention_heads, ops.attention
        self.qkv = ops.linear(c.hidden_size, 3 * c.hidden_size)
        self.attn_out = ops.linear(c.hidden_size, c.hidden_size)
        self.attn_norm = ops.layer_norm(c.hidden_size, c.layer_norm_eps)
        self.up = ops.linear(c.hidden_size, c.intermediate_size, activation=c.hidden_act)
        self.down = ops.linear(c.intermediate_size, c.hidden_size)
        self.out_norm = ops.layer_norm(c.hidden_size, c.layer_norm_eps)

    def forward(self, x: torch.Tensor, batch: PackedBatch, bias: RelativeBias | None = None) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, self.head_dim).unbind(1)  # 3 × (n, heads, dim)
        a = self.attention(q, k, v, batch, scale=self.head_dim ** -0.5, bias=bias).reshape(n, -1)  # (n, hidden)
        # norm(x + attn_out(a)), the add fused where the backend can; the sublayer outputs are scratch
        x = self.attn_norm(self.attn_out(a), x, overwrite_x=True)
        return self.out_norm(self.down(self.up(x)), x, overwrite_x=True)  # (n, hidden)


class BertEncoder(nn.Module):
    """Packed BERT: ``forward(batch) → (n_tokens, hidden)`` last hidden states (a ``PackedModel``)."""

    needs_groups = False

    def __init__(self, c: BertConfig, ops: Ops):
        super().__init__()
        self.config = c
        self.word = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position = LearnedPositions(c.max_position_embeddings, c.hidden_size, c.position_offset)
        self.token_type = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.emb_norm = ops.layer_norm(c.hidden_size, c.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(c, ops) for _ in range(c.num_hidden_layers))

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        types = batch.token_type_ids
        segment = self.token_type.weight[0] if types is None else self.token_type(types)
        x = self.emb_norm(self.word(batch.input_ids) + self.position(batch.positions) + segment,
                          overwrite_x=True)  # (n, hidden)
        for layer in self.layers:
            x = layer(x, batch)
        return x

    def load_weights(self, state: Mapping[str, torch.Tensor], source: str) -> None:
        load_mapped(self, state, weight_names(self.config.num_hidden_layers), source, ignore=HEAD_PREFIXES)


def weight_names(num_layers: int) -> dict[str, str | list[str]]:
    """Our tensor name → transformers' ``BertModel`` name (a list = fused along dim 0)."""
    names: dict[str, str | list[str]] = {**EMBEDDING_NAMES,
                                         "token_type.weight": "embeddings.token_type_embeddings.weight"}
    qkv = ("attention.self.query", "attention.self.key", "attention.self.value")
    return names | layer_names(num_layers, "encoder.layer.{}.", qkv, LAYER_NAMES)


LAYER_NAMES = {"attn_out": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
               "up": "intermediate.dense", "down": "output.dense", "out_norm": "output.LayerNorm"}

BERT = Family(
    name="bert", config=BertConfig.from_hf, model=BertEncoder, default_pooling="CLS",
    heads=frozenset({"model", "sequence_classification", "token_classification", "masked_lm"}),
    prefixes=BASE_PREFIXES,
)
