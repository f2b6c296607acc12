"""gte-multilingual as vLLM serves it (``GteNewModel`` / ``GteNewForSequenceClassification``, selected with
``--hf-overrides``) with the Hub code's NTK rope scaling and ``logn_attention_scale``, on the packed GTE.

transformers' GTE has neither setting, so the reference is the Hub ``NewModel`` forward re-created here from
its description (one unpadded sequence at a time): its rotary cache, built at ``max_position_embeddings *
factor`` from ``theta * factor`` with every frequency over ``factor ** (2 / dim)`` (fixed NTK) or over
``exp(a * m ** b)`` (mixed, ``mixed_b``), and its queries times ``ln(length) / ln(max_position_embeddings)``
(at least 1 with ``logn_attention_clip1``). Without those settings the re-creation equals transformers' GTE,
which anchors it.
"""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForSequenceClassification

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.build import load_model
from tests.workers.pooled import pool_ids
from tests.workers.rope_encoders import SEQS, max_abs, print_figures, reference_hidden, save, worst_cosine

MIN_COSINE = 0.99999
NTK = {"type": "ntk", "factor": 8.0}  # gte-multilingual-base's
SETTINGS = {
    "ntk": {"rope_scaling": NTK},
    "ntk mixed_b": {"rope_scaling": {"type": "ntk", "factor": 4.0, "mixed_b": 0.8}},
    "logn": {"logn_attention_scale": True},
    "logn clip1": {"logn_attention_scale": True, "logn_attention_clip1": True},
    "ntk + logn clip1": {"rope_scaling": NTK, "logn_attention_scale": True, "logn_attention_clip1": True},
}


def _as_hub(folder, architecture: str, **settings) -> dict:
    """Rewrite a saved transformers GTE as the Hub ships gte-multilingual: ``new.`` tensors, model_type "new",
    rope_theta + rope_scaling keys, a short max_position_embeddings (so that logn scales differ from 1)."""
    state = load_file(folder / "model.safetensors")
    save_file({k.replace("gte.", "new.", 1): v for k, v in state.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    hf = json.loads((folder / "config.json").read_text())
    hf["rope_theta"] = hf.pop("rope_parameters")["rope_theta"]
    hf.update({"architectures": [architecture], "model_type": "new", "max_position_embeddings": 16,
               "rope_scaling": None, "logn_attention_scale": False, "logn_attention_clip1": False,
               "layer_norm_type": "layer_norm", "position_embedding_type": "rope", "pack_qkv": True, **settings})
    (folder / "config.json").write_text(json.dumps(hf))
    return hf


def _hub_inv_freq(hf: dict, dim: int) -> torch.Tensor:
    theta, scaling, longest = hf["rope_theta"], hf.get("rope_scaling"), hf["max_position_embeddings"]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))
    if scaling is None or not longest * scaling["factor"] > longest:  # the Hub rebuilds only past its length
        return inv
    factor, b = scaling["factor"], scaling.get("mixed_b")
    if b is None:
        return 1.0 / ((theta * factor) ** (torch.arange(0, dim, 2).float() / dim)) / factor ** (2 / dim)
    a = torch.tensor(factor).log() / (dim / 2) ** b
    return inv / (a * torch.arange(1, dim // 2 + 1).float() ** b).exp()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def hub_hidden(state: dict, hf: dict, ids: list[int]) -> torch.Tensor:
    """The Hub NewModel's last hidden state for one sequence: (len, hidden)."""
    d, heads, eps = hf["hidden_size"], hf["num_attention_heads"], hf["layer_norm_eps"]
    hd, n, inter = d // heads, len(ids), hf["intermediate_size"]
    w = {k.removeprefix("new."): v for k, v in state.items()}
    ln = lambda x, name: F.layer_norm(x, (d,), w[f"{name}.weight"], w[f"{name}.bias"], eps)  # noqa: E731
    lin = lambda x, name: F.linear(x, w[f"{name}.weight"], w.get(f"{name}.bias"))  # noqa: E731
    x = ln(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0],
           "embeddings.LayerNorm")
    freqs = torch.outer(torch.arange(n).float(), _hub_inv_freq(hf, hd))
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # (len, 1, hd)
    cos, sin = emb.cos(), emb.sin()
    scale = 1.0
    if hf.get("logn_attention_scale"):
        scale = math.log(n) / math.log(hf["max_position_embeddings"])
        scale = max(scale, 1.0) if hf.get("logn_attention_clip1") else scale
    for i in range(hf["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        q, k, v = lin(x, f"{p}.attention.qkv_proj").view(n, 3, heads, hd).unbind(1)
        q, k = _rotate(q, cos, sin) * scale, _rotate(k, cos, sin)
        probs = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd), dim=-1)
        x = ln(x + lin(torch.einsum("hqk,khd->qhd", probs, v).reshape(n, d), f"{p}.attention.o_proj"), f"{p}.attn_ln")
        up, gate = lin(x, f"{p}.mlp.up_gate_proj").split(inter, dim=-1)
        x = ln(x + lin(F.gelu(gate) * up, f"{p}.mlp.down_proj"), f"{p}.mlp_ln")
    return x


def _hub(folder, hf, seqs=SEQS) -> list[torch.Tensor]:
    state = load_file(folder / "model.safetensors")
    with torch.no_grad():
        return [hub_hidden(state, hf, s) for s in seqs]


def _load(folder, architecture: str):
    return load_model(WorkerConfig(model=str(folder), served_model_name="g", dtype="float32",
                                   max_batch_tokens=512, hf_overrides={"architectures": [architecture]}))


def test_the_re_created_hub_forward_is_transformers_gte_without_the_hub_only_settings(tmp_path):
    ref = save(tmp_path, "gte", AutoModel)
    want = reference_hidden(ref)
    hf = _as_hub(tmp_path, "NewModel")
    got = torch.cat(_hub(tmp_path, hf))
    assert worst_cosine(got, want) > MIN_COSINE and max_abs(got, want) < 1e-4


@pytest.mark.parametrize("name", list(SETTINGS))
def test_gte_new_model_embeds_as_the_hub_code(tmp_path, name):
    save(tmp_path, "gte", AutoModel)
    hf = _as_hub(tmp_path, "NewForTokenClassification", **SETTINGS[name])  # gte-multilingual-base's config
    model = _load(tmp_path, "GteNewModel")
    assert model.info.tasks[0] == "embed"
    hidden = _hub(tmp_path, hf)
    want = torch.stack([F.normalize(h[0], dim=-1) for h in hidden]).numpy()  # CLS, normalized
    got = pool_ids(model, SEQS)
    assert worst_cosine(got, want) > MIN_COSINE and max_abs(got, want) < 1e-5, (worst_cosine(got, want),
                                                                                 max_abs(got, want))
    plain = {"rope_scaling": None, "logn_attention_scale": False}
    without = torch.stack([F.normalize(h[0], dim=-1) for h in _hub(tmp_path, {**hf, **plain})]).numpy()
    assert max_abs(without, want) > 1e-3  # the setting changes the vectors: honouring it is what agrees


@pytest.mark.parametrize("name", ["ntk", "ntk + logn clip1"])
def test_gte_new_reranker_scores_as_the_hub_code(tmp_path, name):
    """gte-multilingual-reranker-base: CLS → pooler dense + tanh → classifier (one label), sigmoid."""
    save(tmp_path, "gte", AutoModelForSequenceClassification, num_labels=1)
    hf = _as_hub(tmp_path, "NewForSequenceClassification", **SETTINGS[name])
    model = _load(tmp_path, "GteNewForSequenceClassification")
    assert model.info.tasks[0] == "classify"
    state = load_file(tmp_path / "model.safetensors")
    pooled = torch.tanh(F.linear(torch.stack([h[0] for h in _hub(tmp_path, hf)]), state["new.pooler.dense.weight"],
                                 state["new.pooler.dense.bias"]))
    logits = F.linear(pooled, state["classifier.weight"], state["classifier.bias"])  # (n, 1)
    raw = pool_ids(model, SEQS, PoolingParams(task="classify", use_activation=False))
    np.testing.assert_allclose(raw, logits.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(pool_ids(model, SEQS, PoolingParams(task="classify")),
                               torch.sigmoid(logits).numpy(), atol=1e-6)


def test_batched_equals_single_with_logn(tmp_path):
    """The logn scale is each sequence's own length, not the batch's."""
    save(tmp_path, "gte", AutoModel)
    _as_hub(tmp_path, "NewModel", **SETTINGS["logn"])
    model = _load(tmp_path, "GteNewModel")
    together = pool_ids(model, SEQS)
    alone = np.concatenate([pool_ids(model, [s]) for s in SEQS])
    np.testing.assert_allclose(together, alone, atol=1e-6)


@pytest.mark.parametrize("change,message", [({"layer_norm_type": "rms_norm"}, "layer_norm_type"),
                                            ({"position_embedding_type": "absolute"}, "position_embedding_type"),
                                            ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "dynamic")])
def test_settings_it_does_not_run_are_refused(tmp_path, change, message):
    save(tmp_path, "gte", AutoModel)
    _as_hub(tmp_path, "NewModel", **change)
    with pytest.raises(ValueError, match=message):
        _load(tmp_path, "GteNewModel")


def test_inspect_says_packed_gte(tmp_path, capsys):
    from poolgate.gateway.cli import main as poolgate

    save(tmp_path, "gte", AutoModel)
    _as_hub(tmp_path, "NewForTokenClassification", **SETTINGS["ntk + logn clip1"])
    assert poolgate(["inspect", str(tmp_path), "--dtype", "float32", "--backend", "cpu",
                     "--hf-overrides", '{"architectures": ["GteNewModel"]}']) == 0
    rows = {line[:14].strip(): line[16:] for line in capsys.readouterr().out.splitlines()}
    assert rows["architecture"] == "GteNewModel" and rows["implementation"] == "packed gte"
    assert rows["pooling"].startswith("CLS (architecture default)")


def figures(tmp) -> list[tuple[str, float, float]]:
    """(setting, worst fp32 cosine, max abs difference) of GteNewModel's embeddings and
    GteNewForSequenceClassification's logits against the re-created Hub forward."""
    rows = []
    for i, (name, settings) in enumerate(SETTINGS.items()):
        folder = tmp / f"e{i}"
        save(folder, "gte", AutoModel)
        hf = _as_hub(folder, "NewForTokenClassification", **settings)
        want = torch.stack([F.normalize(h[0], dim=-1) for h in _hub(folder, hf)]).numpy()
        got = pool_ids(_load(folder, "GteNewModel"), SEQS)
        rows.append((f"GteNewModel {name}", worst_cosine(got, want), max_abs(got, want)))
        folder = tmp / f"c{i}"
        save(folder, "gte", AutoModelForSequenceClassification, num_labels=2)
        hf = _as_hub(folder, "NewForSequenceClassification", **settings)
        state = load_file(folder / "model.safetensors")
        pooled = torch.tanh(F.linear(torch.stack([h[0] for h in _hub(folder, hf)]), state["new.pooler.dense.weight"],
                                     state["new.pooler.dense.bias"]))
        want = F.linear(pooled, state["classifier.weight"], state["classifier.bias"]).numpy()
        got = pool_ids(_load(folder, "GteNewForSequenceClassification"), SEQS,
                       PoolingParams(task="classify", use_activation=False))
        rows.append((f"GteNewForSequenceClassification {name} (logits)", worst_cosine(got, want), max_abs(got, want)))
    return rows


if __name__ == "__main__":
    print_figures(figures, 58)
