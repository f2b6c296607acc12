"""Position schemes against transformers: RoPE (several configs), MPNet's buckets, RoBERTa's offset."""
import pytest
import torch

from poolgate.workers.models.positions import (
    LearnedPositions, RelativeBuckets, Rope, RopeConfig, learned_offset, relative_bucket)
from poolgate.workers.kernels.rope import apply_rope
from poolgate.workers.batch.packing import pack

LENGTHS = [5, 1, 40, 3]


def _rope_case(name):
    from transformers import LlamaConfig, PhiConfig

    base = dict(hidden_size=64, num_attention_heads=4, max_position_embeddings=4096)
    cases = {
        "default": LlamaConfig(**base, rope_theta=10000.0),
        "theta-1e6-head-32": LlamaConfig(**base, head_dim=32, rope_theta=1_000_000.0),
        "linear": LlamaConfig(**base, rope_scaling={"rope_type": "linear", "factor": 4.0}),
        "llama3": LlamaConfig(**base, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512}),
        "yarn": LlamaConfig(**base, rope_theta=1_000_000.0, rope_scaling={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}),
        "partial-0.5": PhiConfig(**base, partial_rotary_factor=0.5),
    }
    return cases[name]


def _hf_rotary(config):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

    return (PhiRotaryEmbedding if config.model_type == "phi" else LlamaRotaryEmbedding)(config)


def _hf_rotate(x, cos, sin):
    """transformers' rotate-half RoPE on the first cos.shape[-1] dims; x: (seq, heads, dim)."""
    from transformers.models.llama.modeling_llama import rotate_half

    rot = cos.shape[-1]
    xr, rest = x[..., :rot], x[..., rot:]
    return torch.cat([xr * cos[:, None] + rotate_half(xr) * sin[:, None], rest], dim=-1)


@pytest.mark.parametrize("name", ["default", "theta-1e6-head-32", "linear", "llama3", "yarn", "partial-0.5"])
def test_rope_matches_transformers(name):
    hf = _rope_case(name)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    ours = Rope(RopeConfig.from_hf(hf.to_dict(), head_dim))
    batch = pack([[1] * n for n in LENGTHS])
    cos, sin = ours.cos_sin(batch.positions)  # (n_tokens, 1, rot)
    torch.manual_seed(0)
    x = torch.randn(batch.n_tokens, 4, head_dim)
    got = apply_rope(x, cos, sin)
    rotary = _hf_rotary(hf)
    for s, e in zip(batch.cu_seqlens[:-1].tolist(), batch.cu_seqlens[1:].tolist()):
        hf_cos, hf_sin = rotary(x[None, s:e], torch.arange(e - s)[None])  # (1, len, rot)
        torch.testing.assert_close(cos[s:e, 0], hf_cos[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got[s:e], _hf_rotate(x[s:e], hf_cos[0], hf_sin[0]), atol=1e-5, rtol=1e-5)


def test_rope_positions_restart_per_sequence():
    rope = Rope(RopeConfig(head_dim=8, rotary_dim=8, theta=10000.0))
    batch = pack([[1] * 3, [1] * 3])
    cos, sin = rope.cos_sin(batch.positions)
    torch.testing.assert_close(cos[:3], cos[3:], rtol=0, atol=0)


def test_rope_parameters_per_layer_type_and_unknown_types():
    hf = {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert RopeConfig.from_hf(hf, 16, "full_attention").theta == 1e6
    assert RopeConfig.from_hf(hf, 16, "sliding_attention").theta == 1e4
    with pytest.raises(ValueError, match="longrope"):
        RopeConfig.from_hf({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, 16)


@pytest.mark.parametrize("hf,offset", [
    ({"model_type": "bert", "pad_token_id": 0}, 0),
    ({"model_type": "roberta", "pad_token_id": 1}, 2),
    ({"model_type": "xlm-roberta", "pad_token_id": 1}, 2),
    ({"model_type": "camembert", "pad_token_id": 5}, 6),
    ({"model_type": "mpnet", "pad_token_id": 0}, 2),  # MPNet's embedding pads with index 1 whatever the config
])
def test_learned_offset(hf, offset):
    assert learned_offset(hf) == offset


def test_learned_positions_match_roberta_position_ids():
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    ids = torch.tensor([[0, 5, 6, 7, 2]])
    want = RobertaEmbeddings.create_position_ids_from_input_ids(ids, padding_idx=1)
    table = LearnedPositions(16, 4, offset=learned_offset({"model_type": "roberta", "pad_token_id": 1}))
    got_rows = table(pack([ids[0].tolist()]).positions)
    torch.testing.assert_close(got_rows, table.weight[want[0]])


def test_mpnet_buckets_and_bias_match_transformers():
    from transformers import MPNetConfig
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    rel = torch.arange(-300, 301)
    want = MPNetEncoder.relative_position_bucket(rel, num_buckets=32, max_distance=128)
    torch.testing.assert_close(relative_bucket(rel, 32, 128), want)

    config = MPNetConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64)
    torch.manual_seed(0)
    encoder = MPNetEncoder(config)
    ours = RelativeBuckets(heads=4, num_buckets=config.relative_attention_num_buckets)
    ours.table.load_state_dict(encoder.relative_attention_bias.state_dict())
    x = torch.zeros(1, 150, 32)
    with torch.no_grad():
        want_bias = encoder.compute_position_bias(x)[0]  # (heads, L, L)
        got = ours.for_length(150)
    torch.testing.assert_close(got.block(150), want_bias)
    torch.testing.assert_close(got.block(20), want_bias[:, :20, :20])
