"""A packed, padding-free BERT-family encoder (BERT, RoBERTa, XLM-R) in one file.

All tokens of a batch run as one ``(n_tokens, hidden)`` matrix through the
linear layers; only attention sees sequence boundaries (``PackedBatch``).
Weight names follow transformers' ``BertModel``; ``WEIGHT_MAP`` is explicit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from poolgate.workers.kernels.attention import AttentionFn
from poolgate.workers.kernels.linear import FUSED_ACTIVATIONS, PackedLinear
from poolgate.workers.packing import PackedBatch

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
BASE_PREFIXES = ("bert.", "roberta.", "xlm-roberta.", "model.")
POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}  # pad_token_id + 1


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
        offset = POSITION_OFFSET.get(hf.get("model_type", "bert"), 0)
        if offset:
            offset = int(hf.get("pad_token_id", 1)) + 1
        return cls(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            num_hidden_layers=hf["num_hidden_layers"], num_attention_heads=hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"], max_position_embeddings=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2), layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            hidden_act=hf.get("hidden_act", "gelu"), position_offset=offset,
        )


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads, self.head_dim = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        self.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.attn_out = nn.Linear(c.hidden_size, c.hidden_size)
        self.attn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.up = nn.Linear(c.hidden_size, c.intermediate_size)
        self.down = nn.Linear(c.intermediate_size, c.hidden_size)
        self.out_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.act = ACTIVATIONS[c.hidden_act]
        self.act_name = c.hidden_act

    def use_packed_linears(self) -> None:
        """Swap in oneDNN-prepacked linears (CPU), with the activation fused into ``up``."""
        self.qkv, self.attn_out, self.down = (PackedLinear(m) for m in (self.qkv, self.attn_out, self.down))
        if self.act_name in FUSED_ACTIVATIONS:
            self.up, self.act = PackedLinear(self.up, self.act_name), nn.Identity()
        else:
            self.up = PackedLinear(self.up)

    def forward(self, x: torch.Tensor, batch: PackedBatch, attention: AttentionFn) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv(x).view(n, 3, self.heads, self.head_dim)  # (n, 3, heads, dim)
        a = attention(qkv, batch, self.head_dim ** -0.5).reshape(n, -1)  # (n, hidden)
        x = self.attn_norm(x + self.attn_out(a))
        return self.out_norm(x + self.down(self.act(self.up(x))))  # (n, hidden)


class BertEncoder(nn.Module):
    """Packed BERT: ``forward(batch) → (n_tokens, hidden)`` last hidden states."""

    def __init__(self, c: BertConfig, attention: AttentionFn):
        super().__init__()
        self.config, self.attention = c, attention
        self.word = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.emb_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def use_packed_linears(self) -> None:
        """CPU fast path for every layer (see ``workers.kernels.linear``); weights must be final."""
        for layer in self.layers:
            layer.use_packed_linears()

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.word(batch.input_ids) + self.position(batch.positions) + self.token_type.weight[0]
        x = self.emb_norm(x)  # (n_tokens, hidden)
        for layer in self.layers:
            x = layer(x, batch, self.attention)
        return x

    def load_hf_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy transformers-named tensors in, fusing Q/K/V; every weight must be found."""
        own = {}
        for ours, theirs in WEIGHT_MAP.items():
            own[ours] = _get(state, theirs)
        for i in range(self.config.num_hidden_layers):
            p = f"encoder.layer.{i}."
            for kind in ("weight", "bias"):
                own[f"layers.{i}.qkv.{kind}"] = torch.cat(
                    [_get(state, f"{p}attention.self.{m}.{kind}") for m in ("query", "key", "value")]
                )
            for ours, theirs in LAYER_MAP.items():
                own[f"layers.{i}.{ours}"] = _get(state, p + theirs)
        self.load_state_dict(own, strict=True)


WEIGHT_MAP = {
    "word.weight": "embeddings.word_embeddings.weight",
    "position.weight": "embeddings.position_embeddings.weight",
    "token_type.weight": "embeddings.token_type_embeddings.weight",
    "emb_norm.weight": "embeddings.LayerNorm.weight",
    "emb_norm.bias": "embeddings.LayerNorm.bias",
}
LAYER_MAP = {
    "attn_out.weight": "attention.output.dense.weight", "attn_out.bias": "attention.output.dense.bias",
    "attn_norm.weight": "attention.output.LayerNorm.weight", "attn_norm.bias": "attention.output.LayerNorm.bias",
    "up.weight": "intermediate.dense.weight", "up.bias": "intermediate.dense.bias",
    "down.weight": "output.dense.weight", "down.bias": "output.dense.bias",
    "out_norm.weight": "output.LayerNorm.weight", "out_norm.bias": "output.LayerNorm.bias",
}
LEGACY_NAMES = {".weight": ".gamma", ".bias": ".beta"}  # old TF-style LayerNorm names


def _get(state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name in state:
        return state[name]
    for new, old in LEGACY_NAMES.items():
        if "LayerNorm" in name and name.endswith(new) and (alt := name[: -len(new)] + old) in state:
            return state[alt]
    raise KeyError(f"checkpoint has no tensor {name!r}")
