"""The packed decoders' config: one ``DecoderConfig`` read from a Hugging Face config by model type.

Llama, Mistral, Qwen2, Qwen3 and Gemma 1/2/3 share one block (``workers.models.decoder``);
they differ only in the traits below (``TRAITS``). The raw ``config.json`` dict is
first normalized by transformers' own config class for the model type, so
defaults, legacy keys (``rope_theta``/``rope_scaling``, Gemma 3's
``rope_local_base_freq`` and ``sliding_window_pattern``) and derived fields
(``layer_types``, ``head_dim``, Qwen's ``use_sliding_window``) mean exactly what
they mean in transformers 5.24. Attention windows, checked against its
``masking_utils``:

- causal sliding layers (Mistral, Qwen2/3 with ``use_sliding_window``, Gemma 2/3):
  key j for query i when ``i - W < j <= i``, i.e. ``window=(W - 1, 0)``;
- ``"is_causal": false`` (transformers' switch for bidirectional decoders, e.g. through
  ``--hf-overrides``): no causal mask, sliding layers keep ``|i - j| <= W``;
- Gemma 3's ``use_bidirectional_attention`` (EmbeddingGemma): no causal mask, sliding
  layers keep ``|i - j| <= W // 2`` (transformers stores ``W // 2 + 1`` and masks ``< that``);
- an alias model type (``ALIASES``: nemotron's ``llama_bidirec``) is its transformers type
  with the settings it implies (``is_causal: false``), and so is an architecture name
  (``ARCHITECTURE_SETTINGS``: ``VoyageQwen3BidirectionalEmbedModel``, ``GritLM``).
"""
from __future__ import annotations

from dataclasses import dataclass

from poolgate.workers.models.positions import RopeConfig

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Traits:
    """What one model type's block has beyond Llama's."""

    qkv_bias: str | bool = "attention_bias"  # a config key, or fixed
    o_bias: str | bool = "attention_bias"
    qk_norm: bool = False  # RMSNorm over each head's q and k (Qwen3, Gemma 3)
    gemma: bool = False  # (1 + w) RMSNorm, embeddings scaled by sqrt(hidden)
    sandwich: bool = False  # norms after attention and after the MLP too (Gemma 2/3)
    scalar_scale: bool = False  # softmax scale query_pre_attn_scalar ** -0.5 (Gemma 2/3)
    all_sliding: bool = False  # every layer uses sliding_window when it is set (Mistral)
    rope_per_layer_type: bool = False  # rope_parameters per layer type (Gemma 3)


# model types of checkpoints with their own code that are a transformers type with settings: nvidia's
# llama-nemotron embed / rerank (``LlamaBidirectionalModel``: a LlamaModel without the causal mask)
ALIASES: dict[str, tuple[str, dict]] = {"llama_bidirec": ("llama", {"is_causal": False}),
                                        "jina_embeddings_v5": ("qwen3", {})}  # a Qwen3Config subclass, unchanged
# architecture names (vLLM's, chosen with --hf-overrides) that imply settings of their body: voyage-4-nano
# and GritLM (a LlamaForCausalLM checkpoint vLLM ran without the causal mask and without a sliding window)
ARCHITECTURE_SETTINGS: dict[str, dict] = {"VoyageQwen3BidirectionalEmbedModel": {"is_causal": False},
                                          "GritLM": {"is_causal": False, "sliding_window": None}}
TRAITS: dict[str, Traits] = {
    "llama": Traits(),
    "mistral": Traits(qkv_bias=False, o_bias=False, all_sliding=True),
    "qwen2": Traits(qkv_bias=True, o_bias=False),
    "qwen3": Traits(qk_norm=True),
    "gemma": Traits(gemma=True),
    "gemma2": Traits(gemma=True, sandwich=True, scalar_scale=True),
    "gemma3_text": Traits(gemma=True, sandwich=True, scalar_scale=True, qk_norm=True, rope_per_layer_type=True),
}


@dataclass(frozen=True)
class DecoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    activation: str
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    gemma: bool
    sandwich: bool
    scale: float  # softmax scale
    softcap: float | None  # Gemma 2's attn_logit_softcapping
    causal: bool
    windows: tuple[tuple[int, int] | None, ...]  # per layer, the attention contract's window
    layer_rope: tuple[str, ...]  # per layer, its key in ``ropes``
    ropes: tuple[tuple[str, RopeConfig], ...]

    @classmethod
    def from_hf(cls, hf: dict) -> "DecoderConfig":
        hf = with_alias(hf)
        kind = hf.get("model_type")
        if kind not in TRAITS:
            raise ValueError(f"model_type {kind!r} is not a packed decoder (known: {', '.join(TRAITS)})")
        if kind in ("gemma", "gemma2") and hf.get("use_bidirectional_attention"):
            raise ValueError(f"{kind} with use_bidirectional_attention: transformers' own attention paths do not "
                             "agree on what it masks; say it with \"is_causal\": false (--hf-overrides) instead")
        t, c = TRAITS[kind], _normalized(hf)
        n, head_dim = c.num_hidden_layers, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        types = tuple(getattr(c, "layer_types", None) or [SLIDING if t.all_sliding else FULL] * n)
        bidirectional = hf.get("is_causal", True) is False or bool(kind == "gemma3_text" and
                                                                   c.use_bidirectional_attention)
        rope_keys = tuple(types) if t.rope_per_layer_type else ("all",) * n
        return cls(
            model_type=kind, vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=n,
            num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
            head_dim=head_dim, intermediate_size=c.intermediate_size, rms_norm_eps=c.rms_norm_eps,
            activation=getattr(c, "hidden_activation", None) or c.hidden_act,
            qkv_bias=_flag(c, t.qkv_bias), o_bias=_flag(c, t.o_bias), mlp_bias=bool(getattr(c, "mlp_bias", False)),
            qk_norm=t.qk_norm, gemma=t.gemma, sandwich=t.sandwich,
            scale=(c.query_pre_attn_scalar if t.scalar_scale else head_dim) ** -0.5,
            softcap=getattr(c, "attn_logit_softcapping", None), causal=not bidirectional,
            windows=tuple(_window(kind, typ, getattr(c, "sliding_window", None), hf) for typ in types),
            layer_rope=rope_keys,
            ropes=tuple((key, _rope(c, head_dim, key if t.rope_per_layer_type else None))
                        for key in sorted(set(rope_keys))),
        )


def with_alias(hf: dict) -> dict:
    """``hf`` as the transformers model type an alias is (``ALIASES``), with the settings the alias and the
    architecture name (``ARCHITECTURE_SETTINGS``) imply."""
    for arch in hf.get("architectures") or ():
        hf = {**hf, **ARCHITECTURE_SETTINGS.get(arch, {})}
    kind = hf.get("model_type")
    if kind not in ALIASES:
        return hf
    base, implied = ALIASES[kind]
    return {**hf, "model_type": base, **implied}


def _normalized(hf: dict):
    """transformers' own config object for ``hf`` (defaults and legacy keys resolved)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(hf["model_type"], **{k: v for k, v in hf.items() if k != "model_type"})


def _flag(c, key: str | bool) -> bool:
    return key if isinstance(key, bool) else bool(getattr(c, key, False))


def _window(kind: str, layer_type: str, w: int | None, hf: dict) -> tuple[int, int] | None:
    if layer_type != SLIDING or w is None:
        return None
    if kind == "gemma3_text" and hf.get("use_bidirectional_attention"):
        return (w - 1, w - 1)  # transformers stored w = W // 2 + 1 and keeps |i - j| < w
    if hf.get("is_causal", True) is False:
        return (w, w)
    return (w - 1, 0)


def _rope(c, head_dim: int, layer_type: str | None) -> RopeConfig:
    params = dict(c.rope_parameters[layer_type] if layer_type else c.rope_parameters)
    if params.get("rope_type") == "dynamic":
        # dynamic NTK changes the frequencies only past max_position_embeddings, which caps max_model_len
        params = {k: v for k, v in params.items() if k != "factor"} | {"rope_type": "default"}
    hf = {"rope_parameters": params, "max_position_embeddings": c.max_position_embeddings,
          "partial_rotary_factor": getattr(c, "partial_rotary_factor", None) or 1.0}
    return RopeConfig.from_hf(hf, head_dim)
