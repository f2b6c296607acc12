"""A packed GTE encoder ("NewModel", Alibaba-NLP gte-*-v1.5 / gte-multilingual): post-norm, RoPE, gated MLP.

Checked against transformers 5.24's ``modeling_gte`` (which loads the Hub's
``NewModel`` checkpoints, whose tensor names these are):

- embeddings: word (+ token type when ``type_vocab_size > 0``; segment 0 unless
  the batch carries token types) → LayerNorm; no learned positions;
- each layer: ``x = attn_ln(x + o_proj(attention(rope(q), rope(k), v)))`` with fused
  ``qkv_proj`` (biased), then ``x = mlp_ln(x + down_proj(act(gate) * up))`` with
  ``up, gate = up_gate_proj(x).chunk(2)`` (no bias) and a biased ``down_proj``;
- RoPE over the whole head from ``rope_theta`` / ``rope_parameters`` (``workers.models.positions``),
  with the Hub code's NTK scaling (``rope_scaling: {"type": "ntk", "factor", "mixed_b"?}``:
  gte-large-en-v1.5, gte-multilingual-base);
- ``logn_attention_scale`` (Hub code only): each sequence's rotated queries times
  ``ln(length) / ln(max_position_embeddings)``, at least 1 with ``logn_attention_clip1``.

vLLM's names ``GteNewModel`` / ``GteNewForSequenceClassification`` (what
``--hf-overrides '{"architectures": [...]}'`` selects for gte-multilingual, whose
config says ``NewForTokenClassification``) are this family. The same block serves
NomicBERT (``workers.models.nomic_bert``) with its own names and biases, so the
layer is written once here. Settings neither the Hub code's defaults nor this file
run (RMS norm, absolute positions) are refused at load with the setting named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from poolgate.workers.kernels.activations import ACTIVATIONS as BASE_ACTIVATIONS
from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models.base import Family, load_mapped
from poolgate.workers.models.positions import Rope, RopeConfig
from poolgate.workers.batch.packing import PackedBatch

ACTIVATIONS = {**BASE_ACTIVATIONS, "swiglu": F.silu}  # NomicBERT's name for a SiLU-gated MLP
PREFIXES = ("new.", "gte.")
HEAD_PREFIXES = ("pooler.", "classifier.", "lm_head.")
UNSUPPORTED = {  # Hub NewModel settings this file does not implement: key → the value we can run
    "layer_norm_type": "layer_norm",
    "position_embedding_type": "rope",
}


@dataclass(frozen=True)
class GteConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    layer_norm_eps: float
    hidden_act: str
    type_vocab_size: int
    rope: RopeConfig
    qkv_bias: bool = True
    mlp_up_bias: bool = False
    mlp_down_bias: bool = True
    logn_positions: int = 0  # logn_attention_scale: the max_position_embeddings it divides by; 0 = off
    logn_clip1: bool = False
    gated: bool = True  # False: a plain up → act → down MLP (jina-embeddings-v3's fc1 / fc2)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, hf: dict) -> "GteConfig":
        for key, runs in UNSUPPORTED.items():
            if hf.get(key, runs) != runs:
                raise ValueError(f"GTE config sets {key}={hf[key]!r}; poolgate runs only {key}={runs!r}")
        logn = bool(hf.get("logn_attention_scale", False))
        if logn and not hf.get("max_position_embeddings"):
            raise ValueError("GTE config sets logn_attention_scale without the max_position_embeddings it divides by")
        head_dim = hf["hidden_size"] // hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12), hidden_act=hf.get("hidden_act", "gelu"),
            type_vocab_size=int(hf.get("type_vocab_size", 1)),
            rope=RopeConfig.from_hf({"rope_theta": 160_000.0, **hf}, head_dim),
            logn_positions=int(hf["max_position_embeddings"]) if logn else 0,
            logn_clip1=bool(hf.get("logn_attention_clip1", False)),
        )


class GteLayer(nn.Module):
    def __init__(self, c: GteConfig, ops: Ops):
        super().__init__()
        self.heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.attention, self.rope = ops.attention, ops.rope
        self.qkv = ops.linear(c.hidden_size, 3 * c.hidden_size, bias=c.qkv_bias)
        self.attn_out = ops.linear(c.hidden_size, c.hidden_size, bias=c.qkv_bias)
        self.attn_norm = ops.layer_norm(c.hidden_size, c.layer_norm_eps)
        self.gated = c.gated
        self.up_gate = ops.linear(c.hidden_size, (2 if c.gated else 1) * c.intermediate_size, bias=c.mlp_up_bias)
        self.down = ops.linear(c.intermediate_size, c.hidden_size, bias=c.mlp_down_bias)
        self.mlp_norm = ops.layer_norm(c.hidden_size, c.layer_norm_eps)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x: torch.Tensor, batch: PackedBatch, rope: tuple[torch.Tensor, torch.Tensor],
                q_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``q_scale``: (n, 1, 1) per-token factors on the rotated queries (logn attention), or None."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, self.head_dim).unbind(1)  # (n, heads, dim)
        q = self.rope(q, *rope)
        if q_scale is not None:
            q = q * q_scale.to(q.dtype)
        a = self.attention(q, self.rope(k, *rope), v, batch, scale=self.head_dim ** -0.5)
        x = self.attn_norm(x + self.attn_out(a.reshape(n, -1)))  # (n, hidden)
        if not self.gated:
            return self.mlp_norm(x + self.down(self.act(self.up_gate(x))))  # (n, hidden)
        up, gate = self.up_gate(x).chunk(2, dim=-1)  # 2 × (n, intermediate)
        return self.mlp_norm(x + self.down(self.act(gate) * up))  # (n, hidden)


class GteEncoder(nn.Module):
    """Packed GTE (``PackedModel``): ``forward(batch) → (n_tokens, hidden)``; ``names`` is the checkpoint's
    naming (``GTE_NAMES`` here, NomicBERT's in its file)."""

    needs_groups = False

    def __init__(self, c: GteConfig, ops: Ops, names: "WeightNames | None" = None):
        super().__init__()
        self.config, self.hidden_size = c, c.hidden_size
        self.names = names or GTE_NAMES
        self.word = nn.Embedding(c.vocab_size, c.hidden_size)
        self.token_type = nn.Embedding(c.type_vocab_size, c.hidden_size) if c.type_vocab_size else None
        self.emb_norm = ops.layer_norm(c.hidden_size, c.layer_norm_eps)
        self.layers = nn.ModuleList(GteLayer(c, ops) for _ in range(c.num_hidden_layers))
        self.rope = Rope(c.rope)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.word(batch.input_ids)  # (n_tokens, hidden)
        if self.token_type is not None:
            types = batch.token_type_ids
            x = x + self.token_type(torch.zeros_like(batch.input_ids) if types is None else types)  # through forward:
            # a per-request adapter's embedding LoRA (workers.models.task_adapters) applies there
        x = self.emb_norm(x)
        rope = self.rope.cos_sin(batch.positions)  # 2 × (n_tokens, 1, head_dim)
        q_scale = self.logn_scale(batch)
        for layer in self.layers:
            x = layer(x, batch, rope, q_scale)
        return x

    def logn_scale(self, batch: PackedBatch) -> torch.Tensor | None:
        """(n_tokens, 1, 1) ``ln(length) / ln(max_position_embeddings)`` of each token's sequence, or None."""
        c = self.config
        if not c.logn_positions:
            return None
        lengths = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).float()  # (batch,)
        scale = lengths.log() / math.log(c.logn_positions)
        if c.logn_clip1:
            scale = scale.clamp(min=1.0)
        return scale[batch.seg_ids][:, None, None]

    def load_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        load_mapped(self, state, self.names.for_model(self), source, ignore=self.names.head_prefixes)


@dataclass(frozen=True)
class WeightNames:
    """A checkpoint's naming: top-level modules, and per layer ``{i}`` templates; a list value is
    several checkpoint tensors concatenated (along dim 0) into one of ours."""

    top: dict[str, str]
    layer: dict[str, str | list[str]]
    head_prefixes: tuple[str, ...]

    def for_model(self, model: nn.Module) -> dict[str, str | list[str]]:
        """Our tensor name → the checkpoint's, for every tensor ``model`` has."""
        names = {}
        for ours in model.state_dict():
            top, _, rest = ours.partition(".")
            if top != "layers":
                names[ours] = f"{self.top[top]}.{rest}"
                continue
            i, _, sub = rest.partition(".")
            module, _, kind = sub.partition(".")
            theirs = self.layer[module]
            names[ours] = ([f"{t.format(i=i)}.{kind}" for t in theirs] if isinstance(theirs, list)
                           else f"{theirs.format(i=i)}.{kind}")
        return names


GTE_NAMES = WeightNames(
    top={"word": "embeddings.word_embeddings", "token_type": "embeddings.token_type_embeddings",
         "emb_norm": "embeddings.LayerNorm"},
    layer={"qkv": "encoder.layer.{i}.attention.qkv_proj", "attn_out": "encoder.layer.{i}.attention.o_proj",
           "attn_norm": "encoder.layer.{i}.attn_ln", "up_gate": "encoder.layer.{i}.mlp.up_gate_proj",
           "down": "encoder.layer.{i}.mlp.down_proj", "mlp_norm": "encoder.layer.{i}.mlp_ln"},
    head_prefixes=HEAD_PREFIXES,
)

GTE = Family(
    name="gte", config=GteConfig.from_hf, model=GteEncoder, default_pooling="CLS",
    heads=frozenset({"model", "sequence_classification", "token_classification"}),
    prefixes=PREFIXES,
)
