"""The packed decoders (Llama, Mistral, Qwen2, Qwen3, Gemma 1/2/3) against transformers' own forward.

Tiny random checkpoints made here (every weight, norms included, drawn at
random so a mis-mapped or mis-offset norm shows), saved and loaded through
the real path (``read_spec`` → ``build_model``). Sequences of mixed lengths,
several longer than the sliding windows. ``python -m tests.workers.models.test_decoder_golden``
prints the worst fp32 cosine per case.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.build import load_model
from poolgate.workers.kernels.attention import grouped_sdpa, reference_attention
from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models import build_model
from poolgate.workers.batch.packing import pack
from poolgate.workers.load.st_config import read_spec
from tests.fakes import make_tiny_tokenizer
from tests.workers.pooled import pool_ids

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 45)) + [3], [7], [2] + [9, 8, 7, 6] * 4 + [3]]
SHAPE = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=2, eos_token_id=3)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
# case id → (model_type, base class, config extras); windows of 8 against sequences up to 42 tokens
CASES: dict[str, tuple[str, str, dict]] = {
    "llama": ("llama", "LlamaModel", {}),
    "llama-bias-llama3-rope": ("llama", "LlamaModel", {"attention_bias": True, "mlp_bias": True,
                                                         "rope_scaling": LLAMA3_ROPE, "rope_theta": 5e5}),
    "llama-linear-rope-mha": ("llama", "LlamaModel", {"rope_scaling": {"rope_type": "linear", "factor": 2.0},
                                                        "num_key_value_heads": 4}),
    "llama-bidirectional": ("llama", "LlamaModel", {"is_causal": False}),
    "llama-dynamic-rope": ("llama", "LlamaModel", {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}),
    "mistral-sliding": ("mistral", "MistralModel", {"sliding_window": 8}),
    "qwen2-sliding": ("qwen2", "Qwen2Model", {"use_sliding_window": True, "sliding_window": 8,
                                              "max_window_layers": 1}),
    "qwen3": ("qwen3", "Qwen3Model", {"head_dim": 32}),
    "qwen3-bidirectional": ("qwen3", "Qwen3Model", {"head_dim": 32, "is_causal": False}),
    "gemma": ("gemma", "GemmaModel", {"head_dim": 16}),
    "gemma2-softcap": ("gemma2", "Gemma2Model", {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 24,
                                                 "attn_logit_softcapping": 5.0}),
    "gemma2-bidirectional": ("gemma2", "Gemma2Model", {"head_dim": 16, "sliding_window": 8, "is_causal": False,
                                                       "attn_logit_softcapping": None}),
    "gemma3": ("gemma3_text", "Gemma3TextModel", {"head_dim": 16, "sliding_window": 8, "sliding_window_pattern": 2,
                                                  "query_pre_attn_scalar": 24, "rope_theta": 1e5,
                                                  "rope_local_base_freq": 100.0,  # Gemma 3 4B+: global layers
                                                  "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    "gemma3-bidirectional": ("gemma3_text", "Gemma3TextModel", {"head_dim": 16, "sliding_window": 8,
                                                                "sliding_window_pattern": 2,
                                                                "use_bidirectional_attention": True}),
}


def save_tiny(folder, model_type: str, architecture: str, auto=AutoModel, seed: int = 0, **extra):
    """A tiny random checkpoint of ``model_type`` (all weights random, norms too) and a word-level tokenizer."""
    config = AutoConfig.for_model(model_type, architectures=[architecture], **{**SHAPE, **extra})
    torch.manual_seed(seed)
    model = auto.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    make_tiny_tokenizer(folder)
    return model


def reference_hidden(model, seqs) -> list[torch.Tensor]:
    """transformers' last hidden states, one sequence at a time (no padding to get wrong)."""
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs]


def packed_hidden(folder, seqs, attention=grouped_sdpa, **overrides) -> tuple[list[torch.Tensor], str]:
    spec = read_spec(WorkerConfig(model=str(folder), served_model_name="t", hf_overrides=overrides))
    model, arch = build_model(spec, Ops(attention=attention), allow_pickle=False)
    with torch.no_grad():
        out = model(pack(seqs))  # (n_tokens, hidden)
    return list(out.split([len(s) for s in seqs])), arch.implementation


def worst_cosine(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return min(float(torch.nn.functional.cosine_similarity(g, w, dim=-1).min()) for g, w in zip(got, want))


def _case(tmp_path, case: str):
    model_type, base, extra = CASES[case]
    return save_tiny(tmp_path, model_type, base, **extra)


@pytest.mark.parametrize("case", list(CASES))
def test_hidden_states_match_transformers(tmp_path, case):
    ref = _case(tmp_path, case)
    got, implementation = packed_hidden(tmp_path, SEQS)
    assert implementation == f"packed {CASES[case][0].removesuffix('_text')}"  # gemma3_text: family gemma3
    want = reference_hidden(ref, SEQS)
    assert worst_cosine(got, want) >= 0.9999
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("case", ["mistral-sliding", "gemma2-softcap", "gemma3-bidirectional", "qwen3"])
def test_batched_equals_single_and_the_plain_contract(tmp_path, case):
    _case(tmp_path, case)
    together, _ = packed_hidden(tmp_path, SEQS)
    alone = [packed_hidden(tmp_path, [s])[0][0] for s in SEQS]
    plain, _ = packed_hidden(tmp_path, SEQS, attention=reference_attention)  # the contract, one sequence at a time
    for t, a, p in zip(together, alone, plain):
        torch.testing.assert_close(t, a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(t, p, atol=1e-5, rtol=1e-5)


def test_the_window_and_the_causal_mask_are_what_decides(tmp_path):
    """The golden tests can fail: the same weights with no window, or no causal mask, disagree."""
    ref = _case(tmp_path, "mistral-sliding")
    want = reference_hidden(ref, SEQS)
    no_window, _ = packed_hidden(tmp_path, SEQS, sliding_window=None)
    bidirectional, _ = packed_hidden(tmp_path, SEQS, is_causal=False)
    assert worst_cosine(no_window, want) < 0.999 and worst_cosine(bidirectional, want) < 0.999


def test_a_missing_or_misshaped_tensor_names_the_file(tmp_path):
    from safetensors.torch import load_file, save_file

    from poolgate.workers.load.weights import CheckpointError

    save_tiny(tmp_path, "qwen3", "Qwen3Model", head_dim=16)
    state = load_file(tmp_path / "model.safetensors")
    state.pop("layers.1.self_attn.k_norm.weight")
    state["norm.weight"] = torch.zeros(3)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing tensors layers\.1\.self_attn\.k_norm\.weight"
                                              r"; shape mismatch: norm\.weight: checkpoint \(3,\), config expects \(64,\)"):
        packed_hidden(tmp_path, SEQS)


def test_configs_the_packed_decoder_cannot_run_are_refused_by_name(tmp_path):
    save_tiny(tmp_path, "gemma2", "Gemma2Model", head_dim=16)
    with pytest.raises(ValueError, match="use_bidirectional_attention.*is_causal"):
        packed_hidden(tmp_path, SEQS, use_bidirectional_attention=True)
    save_tiny(tmp_path, "llama", "LlamaModel")
    with pytest.raises(ValueError, match="rope scaling type 'longrope' is not supported"):
        packed_hidden(tmp_path, SEQS, rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 8,
                                                    "long_factor": [1.0] * 8})


def _load(folder, **kw):
    return load_model(WorkerConfig(model=str(folder), served_model_name="t", **{"dtype": "float32", **kw},
                                   max_batch_tokens=256))


@pytest.mark.parametrize("model_type, base", [("qwen3", "Qwen3ForCausalLM"), ("gemma2", "Gemma2ForCausalLM")])
def test_causal_lm_converted_to_embed_pools_the_last_token(tmp_path, model_type, base):
    ref = save_tiny(tmp_path, model_type, base, auto=AutoModelForCausalLM, head_dim=16)
    model = _load(tmp_path, convert="embed")
    assert model.runner.model.__class__.__name__ == "PackedDecoder"
    got = pool_ids(model, SEQS)
    want = torch.nn.functional.normalize(torch.stack([h[-1] for h in reference_hidden(ref.model, SEQS)]), dim=-1)
    np.testing.assert_allclose(got, want.numpy(), atol=2e-5)


@pytest.mark.parametrize("model_type, architecture", [("qwen3", "Qwen3ForSequenceClassification"),
                                                      ("gemma3_text", "Gemma3TextForSequenceClassification")])
def test_sequence_classifier_scores_the_last_token(tmp_path, model_type, architecture):
    ref = save_tiny(tmp_path, model_type, architecture, auto=AutoModelForSequenceClassification, num_labels=3,
                    head_dim=16)
    model = _load(tmp_path)
    assert model.runner.model.__class__.__name__ == "PackedDecoder"
    with torch.no_grad():
        logits = torch.stack([ref(input_ids=torch.tensor([s])).logits[0] for s in SEQS])  # (n, 3)
    got = pool_ids(model, SEQS, PoolingParams(task="classify"))
    np.testing.assert_allclose(got, torch.softmax(logits, -1).numpy(), atol=2e-5)


def test_token_classifier_scores_every_token(tmp_path):
    from transformers import AutoModelForTokenClassification

    ref = save_tiny(tmp_path, "qwen2", "Qwen2ForTokenClassification", auto=AutoModelForTokenClassification,
                    num_labels=5)
    model = _load(tmp_path)
    with torch.no_grad():
        logits = torch.cat([ref(input_ids=torch.tensor([s])).logits[0] for s in SEQS])  # (n_tokens, 5)
    got = pool_ids(model, SEQS, PoolingParams(task="token_classify"))
    np.testing.assert_allclose(got, torch.softmax(logits, -1).numpy(), atol=2e-5)


@pytest.mark.parametrize("case", ["qwen3", "gemma2-softcap"])
def test_bf16_on_the_cpu_stays_close_to_fp32(tmp_path, case):
    """The CPU bf16 path (oneDNN-prepacked linears where torch has them) against the same model in fp32."""
    from poolgate.workers.kernels.linear import PackedLinear, packed_linear_available

    _case(tmp_path, case)
    fast, exact = _load(tmp_path, dtype="bfloat16"), _load(tmp_path)
    assert fast.runner.dtype == torch.bfloat16
    assert isinstance(fast.runner.model.layers[0].qkv, PackedLinear) == packed_linear_available()
    a, b = pool_ids(fast, SEQS), pool_ids(exact, SEQS)
    assert float((a * b).sum(1).min()) >= 0.995


def test_inspect_says_what_each_decoder_attends(tmp_path):
    from poolgate.workers.load.inspect import plan

    _case(tmp_path / "g2", "gemma2-softcap")
    _case(tmp_path / "g3", "gemma3-bidirectional")
    g2, g3 = (plan(WorkerConfig(model=str(tmp_path / f), served_model_name="t")) for f in ("g2", "g3"))
    assert g2.implementation == "packed gemma2" and g2.attention.endswith(
        "; causal; sliding windows (left, right) (7, 0); soft-capped logits through poolgate's exact grouped path")
    assert g3.attention.endswith("; bidirectional; sliding windows (left, right) (4, 4)")


def main() -> None:
    import tempfile
    from pathlib import Path

    print("| case | implementation | worst fp32 cosine vs transformers | max abs diff |")
    print("|---|---|---|---|")
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            ref = _case(Path(tmp), case)
            got, implementation = packed_hidden(tmp, SEQS)
            want = reference_hidden(ref, SEQS)
            diff = max(float((g - w).abs().max()) for g, w in zip(got, want))
            print(f"| {case} | {implementation} | {worst_cosine(got, want):.7f} | {diff:.2e} |")


if __name__ == "__main__":
    main()


@pytest.mark.parametrize("case,grouped", [("gemma2-softcap", True), ("qwen3", False)])
def test_soft_capped_logits_get_their_groups_at_prepare_on_any_backend(tmp_path, monkeypatch, case, grouped):
    """Soft-capping only runs grouped: on a backend whose attention reads no plan (CUDA's varlen path), a
    soft-capped model still has its groups planned in prepare, never in the forward; a laned run agrees."""
    from poolgate.workers.backends.cpu import CpuBackend
    from poolgate.workers.engine.sequence import Sequence
    from poolgate.workers.kernels.attention import reference_attention

    monkeypatch.setattr(CpuBackend, "attention", lambda self, dtype: reference_attention)
    _case(tmp_path, case)
    model = _load(tmp_path, num_threads=1)  # one lane: the batch prepared whole
    prepared = model.runner.prepare([Sequence(s, PoolingParams()) for s in SEQS])
    assert (prepared.packed.groups is not None) == grouped
    assert model.runner.model.needs_groups == grouped
    np.testing.assert_allclose(np.concatenate([o.rows.values for o in model.runner.execute(prepared)]),
                               pool_ids(_load(tmp_path), SEQS), atol=1e-5)
