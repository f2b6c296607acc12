"""A packed ModernBERT encoder: pre-norm layers, RoPE, GeGLU, local (windowed) and global attention.

Checked against transformers 5.24's ``modeling_modernbert``:

- embeddings are the token embedding then a LayerNorm (no positions, no token types);
- layer ``i`` is global when ``layer_types[i] == "full_attention"`` (older configs:
  ``i % global_attn_every_n_layers == 0``), local otherwise; a local token attends the keys of its
  own sequence within ``local_attention // 2`` positions on either side (``|i - j| <= w``);
- RoPE per layer kind: ``global_rope_theta`` (160k) and ``local_rope_theta`` (10k) in Hub configs, or
  each layer type's ``rope_parameters`` in configs saved by transformers 5;
- layer 0 has no attention norm; Wqkv / Wo carry a bias only with ``attention_bias``, Wi / Wo only
  with ``mlp_bias``; the MLP is ``Wo(act(input) * gate)`` with ``input, gate = Wi(x).chunk(2)``;
  a final LayerNorm closes the encoder; norms have a bias only with ``norm_bias``.

Heads: the plain ``ModernBertModel``; the classifiers' ``head`` (dense → act → norm) then
``classifier`` (``ModernBertHead``, over the pooled row or every token); a sequence classifier
pools per ``classifier_pooling`` (cls or mean) first; the MLM head's tensors are tolerated.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from poolgate.workers.kernels.activations import ACTIVATIONS
from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models.base import Family, load_mapped
from poolgate.workers.models.positions import Rope, RopeConfig
from poolgate.workers.batch.packing import PackedBatch

GLOBAL, LOCAL = "full_attention", "sliding_attention"
LEGACY_THETA = {GLOBAL: ("global_rope_theta", 160_000.0), LOCAL: ("local_rope_theta", 10_000.0)}
POOLING = {"cls": "CLS", "mean": "MEAN"}  # classifier_pooling → poolgate's pooling method
PREFIXES = ("model.",)
HEAD_PREFIXES = ("head.", "classifier.", "decoder.")


@dataclass(frozen=True)
class ModernBertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    hidden_activation: str
    layer_types: tuple[str, ...]
    half_window: int  # local layers: keys within this many positions on either side
    rope: tuple[tuple[str, RopeConfig], ...]  # (layer type, its rotary settings)
    classifier_pooling: str  # CLS | MEAN
    classifier_activation: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def windows(self) -> tuple[tuple[int, int] | None, ...]:
        """Per layer, the attention window (left, right) of the contract; None = global."""
        return tuple((self.half_window, self.half_window) if t == LOCAL else None for t in self.layer_types)

    @classmethod
    def from_hf(cls, hf: dict) -> "ModernBertConfig":
        n = hf["num_hidden_layers"]
        every = hf.get("global_attn_every_n_layers", 3)
        types = tuple(hf.get("layer_types") or (GLOBAL if i % every == 0 else LOCAL for i in range(n)))
        head_dim = hf["hidden_size"] // hf["num_attention_heads"]
        pooling = hf.get("classifier_pooling", "cls")
        if pooling not in POOLING:
            raise ValueError(f"ModernBERT classifier_pooling {pooling!r} is not one of {sorted(POOLING)}")
        return cls(
            vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_hidden_layers=n,
            num_attention_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
            norm_eps=hf.get("norm_eps", 1e-5), norm_bias=bool(hf.get("norm_bias", False)),
            attention_bias=bool(hf.get("attention_bias", False)), mlp_bias=bool(hf.get("mlp_bias", False)),
            hidden_activation=hf.get("hidden_activation", "gelu"), layer_types=types,
            half_window=int(hf.get("local_attention", 128)) // 2,
            rope=tuple((kind, _rope(hf, kind, head_dim)) for kind in sorted(set(types))),
            classifier_pooling=POOLING[pooling], classifier_activation=hf.get("classifier_activation", "gelu"),
        )


def _rope(hf: dict, kind: str, head_dim: int) -> RopeConfig:
    """The layer type's rotary settings: its ``rope_parameters`` entry, else the legacy theta key."""
    params = dict((hf.get("rope_parameters") or {}).get(kind) or {})
    if not params:  # a Hub config: its rope_scaling applies to both layer types, as transformers reads it
        params = dict(hf.get("rope_scaling") or {})
    key, default = LEGACY_THETA[kind]
    params.setdefault("rope_theta", float(hf.get(key) or default))
    return RopeConfig.from_hf({"rope_parameters": params,
                               "max_position_embeddings": hf.get("max_position_embeddings")}, head_dim)


def _norm(c: ModernBertConfig, ops: Ops) -> nn.Module:
    return ops.layer_norm(c.hidden_size, c.norm_eps, bias=c.norm_bias)


class ModernBertLayer(nn.Module):
    def __init__(self, c: ModernBertConfig, index: int, ops: Ops):
        super().__init__()
        self.heads, self.head_dim = c.num_attention_heads, c.head_dim
        self.attention, self.rope = ops.attention, ops.rope
        self.kind = c.layer_types[index]
        self.window = c.windows[index]
        self.attn_norm = nn.Identity() if index == 0 else _norm(c, ops)
        self.qkv = ops.linear(c.hidden_size, 3 * c.hidden_size, bias=c.attention_bias)
        self.attn_out = ops.linear(c.hidden_size, c.hidden_size, bias=c.attention_bias)
        self.mlp_norm = _norm(c, ops)
        self.up = ops.linear(c.hidden_size, 2 * c.intermediate_size, bias=c.mlp_bias)
        self.down = ops.linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.act = ACTIVATIONS[c.hidden_activation]

    def forward(self, x: torch.Tensor, batch: PackedBatch, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(self.attn_norm(x)).view(n, 3, self.heads, self.head_dim).unbind(1)  # (n, heads, dim)
        q, k = self.rope(q, *rope), self.rope(k, *rope)
        a = self.attention(q, k, v, batch, scale=self.head_dim ** -0.5, window=self.window)  # (n, heads, dim)
        x = x + self.attn_out(a.reshape(n, -1))
        value, gate = self.up(self.mlp_norm(x)).chunk(2, dim=-1)  # 2 × (n, intermediate)
        return x + self.down(self.act(value) * gate)  # (n, hidden)


class ModernBertEncoder(nn.Module):
    """Packed ModernBERT (``PackedModel``): ``forward(batch) → (n_tokens, hidden)`` after the final norm."""

    needs_groups = False

    def __init__(self, c: ModernBertConfig, ops: Ops):
        super().__init__()
        self.config, self.hidden_size = c, c.hidden_size
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.emb_norm = _norm(c, ops)
        self.layers = nn.ModuleList(ModernBertLayer(c, i, ops) for i in range(c.num_hidden_layers))
        self.final_norm = _norm(c, ops)
        self.ropes = nn.ModuleDict({kind: Rope(rc) for kind, rc in c.rope})

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.emb_norm(self.embed(batch.input_ids))  # (n_tokens, hidden)
        rope = {kind: r.cos_sin(batch.positions) for kind, r in self.ropes.items()}  # (n_tokens, 1, head_dim)
        for layer in self.layers:
            x = layer(x, batch, rope[layer.kind])
        return self.final_norm(x)

    def load_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        load_mapped(self, state, self.weight_names(), source, ignore=HEAD_PREFIXES)

    def weight_names(self) -> dict[str, str]:
        """Our tensor name → the checkpoint's (``WEIGHT_MAP`` / ``LAYER_MAP``), for every tensor we have."""
        names = {}
        for ours in self.state_dict():
            top, _, rest = ours.partition(".")
            if top == "layers":
                i, _, sub = rest.partition(".")
                module, _, kind = sub.partition(".")
                names[ours] = f"layers.{i}.{LAYER_MAP[module]}.{kind}"
            else:
                names[ours] = f"{WEIGHT_MAP[top]}.{rest}"
        return names


WEIGHT_MAP = {"embed": "embeddings.tok_embeddings", "emb_norm": "embeddings.norm", "final_norm": "final_norm"}
LAYER_MAP = {
    "attn_norm": "attn_norm", "qkv": "attn.Wqkv", "attn_out": "attn.Wo",
    "mlp_norm": "mlp_norm", "up": "mlp.Wi", "down": "mlp.Wo",
}


class ModernBertHead(nn.Module):
    """The classifiers' ``head`` (dense → act → norm) then ``classifier``: (rows, hidden) → (rows, labels)."""

    def __init__(self, state: dict[str, torch.Tensor], hf: dict):
        super().__init__()
        c = ModernBertConfig.from_hf(hf)
        dense, out = state["head.dense.weight"], state["classifier.weight"]
        self.dense = nn.Linear(dense.shape[1], dense.shape[0], bias="head.dense.bias" in state)
        self.act = ACTIVATIONS[c.classifier_activation]
        self.norm = nn.LayerNorm(dense.shape[0], eps=c.norm_eps, bias="head.norm.bias" in state)
        self.classifier = nn.Linear(out.shape[1], out.shape[0], bias="classifier.bias" in state)
        own = {f"{m}.{p}": state[f"{name}.{p}"] for m, name in HEAD_MAP.items()
               for p in ("weight", "bias") if f"{name}.{p}" in state}
        self.load_state_dict(own, strict=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.norm(self.act(self.dense(x))))  # (rows, labels)


HEAD_MAP = {"dense": "head.dense", "norm": "head.norm", "classifier": "classifier"}


def default_pooling(hf: dict) -> str:
    """CLS, except for a sequence classifier: its ``classifier_pooling`` (cls or mean), as transformers pools."""
    if not (hf.get("architectures") or [""])[0].endswith("ForSequenceClassification"):
        return "CLS"
    return POOLING.get(hf.get("classifier_pooling", "cls"), "CLS")  # an unknown value: from_hf says so


MODERNBERT = Family(
    name="modernbert", config=ModernBertConfig.from_hf, model=ModernBertEncoder, default_pooling="CLS",
    heads=frozenset({"model", "sequence_classification", "token_classification", "masked_lm"}),
    prefixes=PREFIXES, pooling_for=default_pooling,
)
