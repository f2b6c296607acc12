"""A packed DistilBERT encoder: BERT's post-norm layers, learned positions, no token types.

transformers' ``DistilBertModel`` names its tensors differently from BERT
(``transformer.layer.N.attention.q_lin``, ``sa_layer_norm``, ``ffn.lin1`` …)
and reads its sizes from ``dim``, ``n_layers``, ``n_heads`` and
``hidden_dim``; the layer itself is ``models.bert.BertLayer``. Heads
(``pre_classifier`` + ``classifier``, the token ``classifier``, the MLM
``vocab_*`` layers) are loaded by the poolers (``models.score``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models.base import EMBEDDING_NAMES, Family, layer_names, load_mapped
from poolgate.workers.models.bert import BertConfig, BertLayer
from poolgate.workers.models.positions import LearnedPositions
from poolgate.workers.batch.packing import PackedBatch

HEAD_PREFIXES = ("pre_classifier.", "classifier.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.",
                 "qa_outputs.")
LAYER_NORM_EPS = 1e-12  # fixed in transformers' DistilBERT, not in its config


@dataclass(frozen=True)
class DistilBertConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    hidden_dim: int
    max_position_embeddings: int
    activation: str

    @classmethod
    def from_hf(cls, hf: dict) -> "DistilBertConfig":
        return cls(vocab_size=hf["vocab_size"], dim=hf["dim"], n_layers=hf["n_layers"], n_heads=hf["n_heads"],
                   hidden_dim=hf["hidden_dim"], max_position_embeddings=hf["max_position_embeddings"],
                   activation=hf.get("activation", "gelu"))

    def layer(self) -> BertConfig:
        """The same post-norm layer as BERT's, in BERT's terms."""
        return BertConfig(vocab_size=self.vocab_size, hidden_size=self.dim, num_hidden_layers=self.n_layers,
                          num_attention_heads=self.n_heads, intermediate_size=self.hidden_dim,
                          max_position_embeddings=self.max_position_embeddings, type_vocab_size=0,
                          layer_norm_eps=LAYER_NORM_EPS, hidden_act=self.activation, position_offset=0)


class DistilBertEncoder(nn.Module):
    """Packed DistilBERT: ``forward(batch) → (n_tokens, dim)`` last hidden states (a ``PackedModel``)."""

    needs_groups = False

    def __init__(self, c: DistilBertConfig, ops: Ops):
        super().__init__()
        self.config = c
        self.word = nn.Embedding(c.vocab_size, c.dim)
        self.position = LearnedPositions(c.max_position_embeddings, c.dim)
        self.emb_norm = ops.layer_norm(c.dim, LAYER_NORM_EPS)
        self.layers = nn.ModuleList(BertLayer(c.layer(), ops) for _ in range(c.n_layers))

    @property
    def hidden_size(self) -> int:
        return self.config.dim

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.emb_norm(self.word(batch.input_ids) + self.position(batch.positions),
                          overwrite_x=True)  # (n_tokens, dim); the sum is scratch
        for layer in self.layers:
            x = layer(x, batch)
        return x

    def load_weights(self, state: Mapping[str, torch.Tensor], source: str) -> None:
        load_mapped(self, state, weight_names(self.config.n_layers), source, ignore=HEAD_PREFIXES)


def weight_names(num_layers: int) -> dict[str, str | list[str]]:
    """Our tensor name → transformers' ``DistilBertModel`` name (a list = fused along dim 0)."""
    qkv = ("attention.q_lin", "attention.k_lin", "attention.v_lin")
    return EMBEDDING_NAMES | layer_names(num_layers, "transformer.layer.{}.", qkv, LAYER_NAMES)


LAYER_NAMES = {"attn_out": "attention.out_lin", "attn_norm": "sa_layer_norm", "up": "ffn.lin1",
               "down": "ffn.lin2", "out_norm": "output_layer_norm"}

DISTILBERT = Family(
    name="distilbert", config=DistilBertConfig.from_hf, model=DistilBertEncoder, default_pooling="CLS",
    heads=frozenset({"model", "sequence_classification", "token_classification", "masked_lm"}),
    prefixes=("distilbert.",),
)
