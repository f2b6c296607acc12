"""A packed decoder (Llama, Mistral, Qwen2, Qwen3, Gemma 1/2/3) used as an embedder or classifier.

All tokens of a batch run as one ``(n_tokens, hidden)`` matrix; attention sees
the sequence boundaries and is causal within each sequence (or bidirectional
where the config says so, ``workers.models.decoder_config``), with grouped-query
heads, RoPE per packed position and each layer's sliding window. The output
is the final norm's ``(n_tokens, hidden)``; the poolers read LAST at each
sequence's end. Checked against transformers 5.24's modeling files:

- RMSNorm in fp32; Llama-style ``w * x̂`` cast back, Gemma ``x̂ * (1 + w)`` then cast;
- Gemma scales embeddings by ``sqrt(hidden)`` (rounded to the weights' dtype);
- Qwen3 and Gemma 3 normalize each head's q and k before RoPE;
- Gemma 2/3 add norms after attention and after the MLP (``sandwich``) and use
  ``query_pre_attn_scalar ** -0.5``; Gemma 2 soft-caps the attention logits
  (``cap * tanh(s / cap)``), which the ops bundle's attention takes as ``softcap``
  (SDPA and flash cannot express it, so such a model ``needs_groups``).

A batch with skipped prefixes (``PackedBatch.prefix``, the prefix cache's: ``workers.models.prefix``)
holds only the rows after each prefix; each layer's attention then runs through the plan, which
adds the prefix's keys and values. Q/K/V and gate/up are fused at load (``WEIGHT_MAP`` names every
tensor). Linears, RMSNorm, RoPE and attention come from the backend's ops bundle (``kernels.ops``).
"""
from __future__ import annotations

import torch
from torch import nn

from poolgate.workers.kernels.activations import ACTIVATIONS
from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models.base import load_mapped
from poolgate.workers.models.decoder_config import DecoderConfig
from poolgate.workers.models.positions import Rope
from poolgate.workers.batch.packing import PackedBatch

HEAD_PREFIXES = ("score.", "lm_head.")  # classifier and LM head: the poolers read them


class DecoderLayer(nn.Module):
    def __init__(self, c: DecoderConfig, index: int, ops: Ops):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.scale, self.softcap, self.causal = c.scale, c.softcap or None, c.causal
        self.window, self.rope, self.index = c.windows[index], c.layer_rope[index], index
        self.attention, self.apply_rope = ops.attention, ops.rope
        q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.split = (q_out, kv_out, kv_out)

        def norm(dim: int) -> nn.Module:
            return ops.rms_norm(dim, c.rms_norm_eps, c.gemma)

        self.attn_norm = norm(c.hidden_size)
        self.qkv = ops.linear(c.hidden_size, q_out + 2 * kv_out, bias=c.qkv_bias)
        self.o = ops.linear(q_out, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm, self.k_norm = norm(c.head_dim), norm(c.head_dim)
        if c.sandwich:
            self.attn_post_norm, self.mlp_post_norm = norm(c.hidden_size), norm(c.hidden_size)
        self.mlp_norm = norm(c.hidden_size)
        self.gate_up = ops.linear(c.hidden_size, 2 * c.intermediate_size, bias=c.mlp_bias)
        self.down = ops.linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        self.act = ACTIVATIONS[c.activation]

    def forward(self, x: torch.Tensor, batch: PackedBatch, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(self.attn_norm(x)).split(self.split, dim=-1)
        q = q.view(n, self.heads, self.head_dim)  # (n, heads, d)
        k, v = k.view(n, self.kv_heads, self.head_dim), v.view(n, self.kv_heads, self.head_dim)  # (n, kv, d)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.apply_rope(q, *rope), self.apply_rope(k, *rope)
        kw = dict(scale=self.scale, causal=self.causal, window=self.window, softcap=self.softcap)
        if batch.prefix is not None:  # rows after a cached prefix (workers.models.prefix)
            a = batch.prefix.attend(self.attention, q, k, v, batch, self.index, **kw)  # (n, heads, d)
        else:
            a = self.attention(q, k, v, batch, **kw)  # (n, heads, d)
        a = self.o(a.reshape(n, -1))  # (n, hidden)
        x = x + (self.attn_post_norm(a) if hasattr(self, "attn_post_norm") else a)
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)  # 2 × (n, intermediate)
        m = self.down(self.act(gate) * up)  # (n, hidden)
        return x + (self.mlp_post_norm(m) if hasattr(self, "mlp_post_norm") else m)


class PackedDecoder(nn.Module):
    """``PackedModel`` for every decoder family: ``forward(batch) → (n_tokens, hidden)`` after the final norm."""

    supports_prefix = True  # runs batches with skipped prefixes (``PackedBatch.prefix``; workers.engine.prefix_cache)

    def __init__(self, c: DecoderConfig, ops: Ops):
        super().__init__()
        self.config, self.hidden_size = c, c.hidden_size
        self.needs_groups = bool(c.softcap)  # soft-capped logits: attention the varlen kernel cannot do
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, i, ops) for i in range(c.num_hidden_layers))
        self.norm = ops.rms_norm(c.hidden_size, c.rms_norm_eps, c.gemma)
        self.ropes = nn.ModuleDict({key: Rope(rc) for key, rc in c.ropes})

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.embed(batch.input_ids)  # (n_tokens, hidden)
        if self.config.gemma:
            x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
        rope = {key: r.cos_sin(batch.positions) for key, r in self.ropes.items()}  # (n_tokens, 1, rotary)
        for layer in self.layers:
            x = layer(x, batch, rope[layer.rope])
        return self.norm(x)

    def load_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        load_mapped(self, state, weight_names(self), source, ignore=HEAD_PREFIXES)  # saved inv_freq: a buffer


LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "o.weight": "self_attn.o_proj.weight", "o.bias": "self_attn.o_proj.bias",
    "q_norm.weight": "self_attn.q_norm.weight", "k_norm.weight": "self_attn.k_norm.weight",
    "down.weight": "mlp.down_proj.weight", "down.bias": "mlp.down_proj.bias",
    "mlp_post_norm.weight": "post_feedforward_layernorm.weight",
}


def weight_names(model: PackedDecoder) -> dict[str, str | list[str]]:
    """Our tensor name → transformers' (a list = fused along dim 0), for this config's tensors only."""
    names: dict[str, str | list[str]] = {"embed.weight": "embed_tokens.weight", "norm.weight": "norm.weight"}
    sandwich = model.config.sandwich
    for i in range(model.config.num_hidden_layers):
        p = f"layers.{i}."
        layer = {
            **LAYER_MAP,
            "qkv.weight": [f"self_attn.{m}_proj.weight" for m in "qkv"],
            "qkv.bias": [f"self_attn.{m}_proj.bias" for m in "qkv"],
            "gate_up.weight": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
            "gate_up.bias": ["mlp.gate_proj.bias", "mlp.up_proj.bias"],
            # Gemma 2/3 name the post-attention norm as Llama names its pre-MLP norm
            "attn_post_norm.weight": "post_attention_layernorm.weight",
            "mlp_norm.weight": "pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight",
        }
        for ours, theirs in layer.items():
            names[p + ours] = [p + t for t in theirs] if isinstance(theirs, list) else p + theirs
    own = set(model.state_dict())
    return {k: v for k, v in names.items() if k in own}
