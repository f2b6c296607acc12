"""A packed MPNet encoder: BERT's post-norm layers plus a relative position bias shared by all layers.

transformers' ``MPNetModel`` adds learned absolute positions (numbered from
the pad id + 1, as RoBERTa) and, in every layer's attention scores, a bias
looked up from one ``(buckets, heads)`` table by the log-bucketed distance
``key - query`` (``models.positions.RelativeBuckets``). The bias is built once
per forward for the batch's longest sequence and sliced per attention group.
Heads (``classifier.dense`` + ``out_proj``, the token ``classifier``,
``lm_head``) are loaded by the poolers (``models.score``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models.base import EMBEDDING_NAMES, Family, layer_names, load_mapped
from poolgate.workers.models.bert import BertConfig, BertLayer
from poolgate.workers.models.positions import LearnedPositions, RelativeBuckets
from poolgate.workers.batch.packing import PackedBatch

HEAD_PREFIXES = ("classifier.", "lm_head.", "pooler.", "qa_outputs.")


@dataclass(frozen=True)
class MPNetConfig:
    bert: BertConfig  # the shared sizes, activation, eps and position offset
    relative_attention_num_buckets: int

    @classmethod
    def from_hf(cls, hf: dict) -> "MPNetConfig":
        return cls(BertConfig.from_hf({**hf, "type_vocab_size": 0}), hf.get("relative_attention_num_buckets", 32))


class MPNetEncoder(nn.Module):
    """Packed MPNet: ``forward(batch) → (n_tokens, hidden)`` last hidden states (a ``PackedModel``)."""

    needs_groups = True  # the relative bias: attention the varlen kernel cannot do

    def __init__(self, c: MPNetConfig, ops: Ops):
        super().__init__()
        b = c.bert
        self.config = c
        self.word = nn.Embedding(b.vocab_size, b.hidden_size)
        self.position = LearnedPositions(b.max_position_embeddings, b.hidden_size, b.position_offset)
        self.emb_norm = ops.layer_norm(b.hidden_size, b.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(b, ops) for _ in range(b.num_hidden_layers))
        self.relative = RelativeBuckets(b.num_attention_heads, table_size=c.relative_attention_num_buckets)

    @property
    def hidden_size(self) -> int:
        return self.config.bert.hidden_size

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.emb_norm(self.word(batch.input_ids) + self.position(batch.positions),
                          overwrite_x=True)  # (n_tokens, hidden); the sum is scratch
        bias = self.relative.for_length(batch.max_len)  # (heads, max_len, max_len), shared by every layer
        for layer in self.layers:
            x = layer(x, batch, bias)
        return x

    def load_weights(self, state: Mapping[str, torch.Tensor], source: str) -> None:
        load_mapped(self, state, weight_names(self.config.bert.num_hidden_layers), source, ignore=HEAD_PREFIXES)


def weight_names(num_layers: int) -> dict[str, str | list[str]]:
    """Our tensor name → transformers' ``MPNetModel`` name (a list = fused along dim 0)."""
    names: dict[str, str | list[str]] = {**EMBEDDING_NAMES,
                                         "relative.table.weight": "encoder.relative_attention_bias.weight"}
    qkv = ("attention.attn.q", "attention.attn.k", "attention.attn.v")
    return names | layer_names(num_layers, "encoder.layer.{}.", qkv, LAYER_NAMES)


LAYER_NAMES = {"attn_out": "attention.attn.o", "attn_norm": "attention.LayerNorm", "up": "intermediate.dense",
               "down": "output.dense", "out_norm": "output.LayerNorm"}

MPNET = Family(
    name="mpnet", config=MPNetConfig.from_hf, model=MPNetEncoder, default_pooling="CLS",
    heads=frozenset({"model", "sequence_classification", "token_classification", "masked_lm"}),
    prefixes=("mpnet.",),
)
