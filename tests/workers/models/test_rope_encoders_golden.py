"""Packed ModernBERT, GTE and NomicBERT against transformers' own forward on tiny random checkpoints (fp32)."""
import json

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.build import load_model
from poolgate.workers.kernels.attention import reference_attention
from poolgate.workers.batch.packing import pack
from poolgate.workers.load.weights import CheckpointError
from tests.workers.pooled import pool_ids
from tests.workers.rope_encoders import (CONFIGS, SEQS, cls_rows, mean_rows, packed_hidden, packed_model,
                                         reference_hidden, reference_logits, save, to_hub_modernbert_config,
                                         worst_cosine)

FAMILIES = list(CONFIGS)
MIN_COSINE = 0.9999


def _agree(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert worst_cosine(got, want) >= MIN_COSINE
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_and_pooled_match_transformers(tmp_path, family):
    ref = save(tmp_path, family, AutoModel)
    got, want = packed_hidden(packed_model(tmp_path)), reference_hidden(ref)
    _agree(got, want)
    _agree(cls_rows(got), cls_rows(want))
    _agree(mean_rows(got), mean_rows(want))


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_equals_single(tmp_path, family):
    save(tmp_path, family, AutoModel)
    model = packed_model(tmp_path)
    together = packed_hidden(model)
    alone = torch.cat([packed_hidden(model, [s]) for s in SEQS])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_grouped_sdpa_equals_the_plain_contract(tmp_path, family):
    """The CPU path (SDPA per length group, masks from the plan) equals the per-sequence reference."""
    save(tmp_path, family, AutoModel)
    torch.testing.assert_close(packed_hidden(packed_model(tmp_path)),
                               packed_hidden(packed_model(tmp_path, reference_attention)), atol=1e-5, rtol=1e-5)


def test_modernbert_local_window_is_what_makes_it_agree(tmp_path):
    """The sequences run past the local window: without it the packed model would be measurably off."""
    ref = save(tmp_path, "modernbert", AutoModel)
    model = packed_model(tmp_path)
    assert [layer.window for layer in model.layers] == [None, (4, 4), (4, 4), None]
    for layer in model.layers:
        layer.window = None
    assert (packed_hidden(model) - reference_hidden(ref)).abs().max() > 1e-2


def test_modernbert_hub_config_keys(tmp_path):
    """Hub configs say global_attn_every_n_layers and global/local_rope_theta instead of layer_types and
    rope_parameters; they build the same model."""
    ref = save(tmp_path, "modernbert", AutoModel)
    to_hub_modernbert_config(tmp_path)
    model = packed_model(tmp_path)
    assert [r.config.theta for r in model.ropes.values()] == [1000.0, 50.0]
    _agree(packed_hidden(model), reference_hidden(ref))


def test_modernbert_hub_rope_scaling_applies_to_both_layer_types(tmp_path):
    ref = save(tmp_path, "modernbert", AutoModel, rope_scaling={"rope_type": "linear", "factor": 2.0})
    to_hub_modernbert_config(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rope_scaling": {"type": "linear", "factor": 2.0}}))
    model = packed_model(tmp_path)
    assert all(dict(r.config.scaling).get("factor") == 2.0 for r in model.ropes.values())
    _agree(packed_hidden(model), reference_hidden(ref))


def test_nomic_hub_config_keys(tmp_path):
    """nomic-embed-text's own config.json uses GPT-2 style keys (n_embd, n_layer, rotary_emb_base, ...)."""
    ref = save(tmp_path, "nomic_bert", AutoModel)
    path = tmp_path / "config.json"
    hf = json.loads(path.read_text())
    theta = hf.pop("rope_parameters")["rope_theta"]
    for ours, hub in (("hidden_size", "n_embd"), ("num_hidden_layers", "n_layer"), ("num_attention_heads", "n_head"),
                      ("intermediate_size", "n_inner"), ("layer_norm_eps", "layer_norm_epsilon"),
                      ("hidden_act", "activation_function")):
        hf[hub] = hf.pop(ours)
    hf.update(activation_function="swiglu", rotary_emb_base=theta, rotary_emb_fraction=1.0, prenorm=False,
              qkv_proj_bias=False, mlp_fc1_bias=False, mlp_fc2_bias=False, rotary_emb_interleaved=False)
    path.write_text(json.dumps(hf))
    _agree(packed_hidden(packed_model(tmp_path)), reference_hidden(ref))


def test_gte_hub_config(tmp_path):
    """The Hub's gte-*-v1.5 config.json: NewModel, model_type "new", plain rope_theta (remote code there)."""
    ref = save(tmp_path, "gte", AutoModel)
    path = tmp_path / "config.json"
    hf = json.loads(path.read_text())
    hf["rope_theta"] = hf.pop("rope_parameters")["rope_theta"]
    path.write_text(json.dumps({**hf, "architectures": ["NewModel"], "model_type": "new", "rope_scaling": None,
                                "logn_attention_scale": False, "layer_norm_type": "layer_norm",
                                "position_embedding_type": "rope", "pack_qkv": True}))
    _agree(packed_hidden(packed_model(tmp_path)), reference_hidden(ref))


def test_gte_token_type_ids(tmp_path):
    """Cross-encoder pairs: GTE embeds the batch's segment ids (type_vocab_size 2 here)."""
    ref = save(tmp_path, "gte", AutoModel)
    types = [[0] * 3 + [1] * (len(s) - 3) if len(s) > 3 else None for s in SEQS]
    with torch.no_grad():
        got = packed_model(tmp_path)(pack(SEQS, token_types=types))
        want = torch.cat([ref(input_ids=torch.tensor([s]),
                              token_type_ids=torch.tensor([t if t is not None else [0] * len(s)])).last_hidden_state[0]
                          for s, t in zip(SEQS, types)])
    _agree(got, want)


def _load(folder):
    return load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32",
                                   max_batch_tokens=512))


@pytest.mark.parametrize("family,extra", [("modernbert", {"classifier_pooling": "cls"}),
                                          ("modernbert", {"classifier_pooling": "mean"}),
                                          ("gte", {}), ("nomic_bert", {})])
def test_sequence_classifier(tmp_path, family, extra):
    ref = save(tmp_path, family, AutoModelForSequenceClassification, num_labels=3, **extra)
    model = _load(tmp_path)
    assert model.info.tasks == ("classify", "token_classify")
    logits = torch.stack(reference_logits(ref))  # (n, 3)
    raw = pool_ids(model, SEQS, PoolingParams(task="classify", use_activation=False))
    assert worst_cosine(raw, logits.numpy()) >= MIN_COSINE
    np.testing.assert_allclose(raw, logits.numpy(), atol=1e-4, rtol=1e-4)
    probs = pool_ids(model, SEQS, PoolingParams(task="classify"))
    np.testing.assert_allclose(probs, torch.softmax(logits, -1).numpy(), atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_token_classifier(tmp_path, family):
    ref = save(tmp_path, family, AutoModelForTokenClassification, num_labels=5)
    model = _load(tmp_path)
    assert model.info.tasks == ("token_classify",)
    got = pool_ids(model, SEQS, PoolingParams(task="token_classify", use_activation=False))
    want = torch.cat(reference_logits(ref)).numpy()  # (n_tokens, 5)
    assert worst_cosine(got, want) >= MIN_COSINE
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_missing_tensor_names_file_and_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    save(tmp_path, "modernbert", AutoModel)
    state = load_file(tmp_path / "model.safetensors")
    state.pop("layers.2.mlp.Wi.weight")
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*layers\.2\.mlp\.Wi\.weight"):
        packed_model(tmp_path)


@pytest.mark.parametrize("change,message", [
    ({"layer_norm_type": "rms_norm"}, "layer_norm_type"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic"),
])
def test_gte_settings_it_cannot_run_are_refused(tmp_path, change, message):
    """Hub NewModel configs (rope_theta + rope_scaling, no rope_parameters) with settings we cannot run
    (NTK scaling and logn_attention_scale run: tests/workers/models/test_gte_new.py)."""
    save(tmp_path, "gte", AutoModel)
    path = tmp_path / "config.json"
    hf = json.loads(path.read_text())
    hf["rope_theta"] = hf.pop("rope_parameters")["rope_theta"]
    path.write_text(json.dumps({**hf, "architectures": ["NewModel"], "model_type": "new", **change}))
    with pytest.raises(ValueError, match=message):
        packed_model(tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_prepacked_bf16_linears_match_plain_ones(tmp_path, family):
    """The CPU bf16 path (oneDNN-prepacked linears) computes what the plain bf16 linears do."""
    from poolgate.workers.kernels.linear import packed_linear_available, prepack_linears

    if not packed_linear_available():
        pytest.skip("no oneDNN bf16 linears here (torch built without oneDNN, or a CPU without its bf16 path)")
    save(tmp_path, family, AutoModel)
    model = packed_model(tmp_path).to(torch.bfloat16)
    plain = packed_hidden(model).float()
    prepack_linears(model)
    assert worst_cosine(packed_hidden(model).float(), plain) >= 0.999
