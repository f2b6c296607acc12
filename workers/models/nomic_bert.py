"""A packed NomicBERT encoder (nomic-embed-text v1 / v1.5): GTE's post-norm RoPE block, SwiGLU, no biases.

Checked against transformers 5.24's ``modeling_nomic_bert``, which loads the
Hub checkpoints under the names used here (``encoder.layers.{i}.attn.Wqkv``,
``mlp.fc11`` = up, ``mlp.fc12`` = gate, ``norm1``/``norm2``, a top-level
``emb_ln``). The block itself is ``workers.models.gte.GteLayer``; only the
config keys, the biases and the names differ. Hub configs use GPT-2 style
keys (``n_embd``, ``n_layer``, ``rotary_emb_base`` ...), transformers 5 the BERT
ones; both are read. Pre-norm and interleaved-rotary variants are refused.
"""
from __future__ import annotations

from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models.base import Family
from poolgate.workers.models.gte import ACTIVATIONS, GteConfig, GteEncoder, WeightNames
from poolgate.workers.models.positions import RopeConfig

PREFIXES = ("nomic_bert.", "bert.")
HEAD_PREFIXES = ("pooler.", "classifier.", "cls.")
ALIASES = {  # transformers' key → the Hub (GPT-2 style) key
    "hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
    "intermediate_size": "n_inner", "layer_norm_eps": "layer_norm_epsilon", "hidden_act": "activation_function",
    "max_position_embeddings": "n_positions",
}
REFUSED = {"prenorm": False, "rotary_emb_interleaved": False, "use_rms_norm": False, "causal": False}


def _get(hf: dict, key: str, default=None):
    return hf.get(key, hf.get(ALIASES.get(key, ""), default))


def nomic_config(hf: dict) -> GteConfig:
    """A ``GteConfig`` from a NomicBERT config (either key style)."""
    for key, runs in REFUSED.items():
        if hf.get(key, runs) != runs:
            raise ValueError(f"NomicBERT config sets {key}={hf[key]!r}; poolgate runs only {key}={runs!r}")
    hidden, heads = _get(hf, "hidden_size"), _get(hf, "num_attention_heads")
    head_dim = int(hf.get("head_dim") or hidden // heads)
    act = _get(hf, "hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ValueError(f"NomicBERT activation {act!r} is not one of {sorted(ACTIVATIONS)}")
    rope = dict(hf)
    if "rotary_emb_base" in hf:  # Hub style: base and fraction under their own names
        rope |= {"rope_theta": float(hf["rotary_emb_base"]),
                 "partial_rotary_factor": float(hf.get("rotary_emb_fraction") or 1.0)}
        if hf.get("rotary_scaling_factor"):
            raise ValueError("NomicBERT rotary_scaling_factor (dynamic NTK) is not supported")
    return GteConfig(
        vocab_size=hf["vocab_size"], hidden_size=hidden, num_hidden_layers=_get(hf, "num_hidden_layers"),
        num_attention_heads=heads, intermediate_size=_get(hf, "intermediate_size") or 4 * hidden,
        layer_norm_eps=_get(hf, "layer_norm_eps", 1e-12), hidden_act=act,
        type_vocab_size=int(hf.get("type_vocab_size", 2)),
        rope=RopeConfig.from_hf({"rope_theta": 1000.0, **rope}, head_dim),
        qkv_bias=bool(hf.get("qkv_proj_bias", False)), mlp_up_bias=bool(hf.get("mlp_fc1_bias", False)),
        mlp_down_bias=bool(hf.get("mlp_fc2_bias", False)),
    )


NOMIC_NAMES = WeightNames(
    top={"word": "embeddings.word_embeddings", "token_type": "embeddings.token_type_embeddings",
         "emb_norm": "emb_ln"},
    layer={"qkv": "encoder.layers.{i}.attn.Wqkv", "attn_out": "encoder.layers.{i}.attn.out_proj",
           "attn_norm": "encoder.layers.{i}.norm1",
           "up_gate": ["encoder.layers.{i}.mlp.fc11", "encoder.layers.{i}.mlp.fc12"],  # [up, gate]
           "down": "encoder.layers.{i}.mlp.fc2", "mlp_norm": "encoder.layers.{i}.norm2"},
    head_prefixes=HEAD_PREFIXES,
)


def nomic_encoder(c: GteConfig, ops: Ops) -> GteEncoder:
    """The packed NomicBERT: GTE's encoder under NomicBERT's tensor names."""
    return GteEncoder(c, ops, NOMIC_NAMES)


NOMIC_BERT = Family(
    name="nomic_bert", config=nomic_config, model=nomic_encoder, default_pooling="CLS",
    heads=frozenset({"model", "sequence_classification", "token_classification"}),
    prefixes=PREFIXES,
)
