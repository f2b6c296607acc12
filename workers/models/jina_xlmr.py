"""jina-embeddings-v3's encoder (``JinaRobertaModel``, vLLM's name): XLM-R with rotary positions, on GTE's block.

jinaai/jina-embeddings-v3 says ``XLMRobertaModel`` with ``position_embedding_type:
"rotary"`` and ships its own code (``XLMRobertaLoRA`` over a flash-attention XLM-R);
``workers.load.st_config`` reads such a config as ``JinaRobertaModel``, as vLLM
does. The block is the flash-attention BERT one: post-norm, fused biased ``Wqkv``
and ``out_proj`` (``mixer.``), a plain ``fc1 → act → fc2`` MLP with biases,
``norm1``/``norm2``, a top-level ``emb_ln``; word + token-type embeddings, no
position table; rotate-halves RoPE over ``rotary_emb_dim`` (the whole head by
default) from ``rotary_emb_base``, positions counted from 0. The task LoRA saved
beside every weight is merged at load (``workers.load.lora.Parametrized``).
Pre-norm and interleaved rotary are refused.
"""
from __future__ import annotations

from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models.base import Family
from poolgate.workers.models.gte import ACTIVATIONS, GteConfig, GteEncoder, WeightNames
from poolgate.workers.models.positions import RopeConfig

PREFIXES = ("roberta.",)
HEAD_PREFIXES = ("pooler.", "classifier.", "lm_head.")
REFUSED = {"prenorm": False, "rotary_emb_interleaved": False, "position_embedding_type": "rotary",
           "rotary_emb_scale_base": None}


def jina_config(hf: dict) -> GteConfig:
    """A ``GteConfig`` (plain MLP, all biases) from a jina-embeddings-v3 config."""
    for key, runs in REFUSED.items():
        if hf.get(key, runs) != runs:
            raise ValueError(f"jina XLM-R config sets {key}={hf[key]!r}; poolgate runs only {key}={runs!r}")
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ValueError(f"jina XLM-R activation {act!r} is not one of {sorted(ACTIVATIONS)}")
    head_dim = hf["hidden_size"] // hf["num_attention_heads"]
    rotary = int(hf.get("rotary_emb_dim") or head_dim)
    return GteConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
        layer_norm_eps=hf.get("layer_norm_eps", 1e-5), hidden_act=act,
        type_vocab_size=int(hf.get("type_vocab_size", 1)),
        rope=RopeConfig.from_hf({"rope_theta": float(hf.get("rotary_emb_base", 10000.0)),
                                 "partial_rotary_factor": rotary / head_dim}, head_dim),
        qkv_bias=True, mlp_up_bias=True, mlp_down_bias=True, gated=False,
    )


JINA_NAMES = WeightNames(
    top={"word": "embeddings.word_embeddings", "token_type": "embeddings.token_type_embeddings",
         "emb_norm": "emb_ln"},
    layer={"qkv": "encoder.layers.{i}.mixer.Wqkv", "attn_out": "encoder.layers.{i}.mixer.out_proj",
           "attn_norm": "encoder.layers.{i}.norm1", "up_gate": "encoder.layers.{i}.mlp.fc1",
           "down": "encoder.layers.{i}.mlp.fc2", "mlp_norm": "encoder.layers.{i}.norm2"},
    head_prefixes=HEAD_PREFIXES,
)


def jina_encoder(c: GteConfig, ops: Ops) -> GteEncoder:
    return GteEncoder(c, ops, JINA_NAMES)


JINA_XLMR = Family(name="jina_xlmr", config=jina_config, model=jina_encoder, default_pooling="MEAN",
                   heads=frozenset({"model"}), prefixes=PREFIXES)
