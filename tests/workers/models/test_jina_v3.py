"""jina-embeddings-v3 (an ``XLMRobertaModel`` config with rotary positions and five task LoRAs saved as torch
parametrizations) on the packed GTE block with the chosen task merged at load, against the model's own computation
re-created here from its description: a padded batch through a post-norm flash-attention XLM-R (fused ``Wqkv``,
rotate-halves RoPE from position 0, ``fc1 → gelu → fc2``), every weight its parametrization's ``original + alpha /
rank · B[t] @ A[t]`` (``A[t] @ B[t]`` for embeddings) applied at forward time, mean over real tokens, normalized."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from poolgate.gateway.cli import main as poolgate
from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.load.weights import CheckpointError
from tests.fakes import make_tiny_tokenizer
from tests.workers.pooled import pool_ids
from tests.workers.rope_encoders import SEQS, max_abs, print_figures, worst_cosine

TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]
HF = {"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "vocab_size": 100, "hidden_size": 32,
      "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48, "hidden_act": "gelu",
      "layer_norm_eps": 1e-5, "type_vocab_size": 1, "max_position_embeddings": 130, "pad_token_id": 1,
      "position_embedding_type": "rotary", "rotary_emb_base": 1000.0, "lora_adaptations": TASKS, "lora_rank": 4,
      "lora_alpha": 2, "task_instructions": {t: "" for t in TASKS}}
ORIGINAL, A, B = ".parametrizations.weight.original", ".parametrizations.weight.0.lora_A", \
    ".parametrizations.weight.0.lora_B"


def _checkpoint(folder) -> dict[str, torch.Tensor]:
    """A random jina-embeddings-v3 state (``roberta.`` names, parametrized weights with per-task LoRAs)."""
    g = torch.Generator().manual_seed(0)
    rnd = lambda *shape, s=0.2: torch.randn(*shape, generator=g) * s  # noqa: E731
    d, inter, r, n = HF["hidden_size"], HF["intermediate_size"], HF["lora_rank"], len(TASKS)
    state = {}

    def linear(name, out, inp):
        state.update({name + ORIGINAL: rnd(out, inp), name + A: rnd(n, r, inp), name + B: rnd(n, out, r),
                      name + ".bias": rnd(out)})

    def embedding(name, rows):
        state.update({name + ORIGINAL: rnd(rows, d, s=1.0), name + A: rnd(n, rows, r), name + B: rnd(n, r, d)})

    def norm(name):
        state.update({name + ".weight": 1 + rnd(d), name + ".bias": rnd(d)})

    embedding("roberta.embeddings.word_embeddings", HF["vocab_size"])
    embedding("roberta.embeddings.token_type_embeddings", HF["type_vocab_size"])
    norm("roberta.emb_ln")
    for i in range(HF["num_hidden_layers"]):
        p = f"roberta.encoder.layers.{i}."
        linear(p + "mixer.Wqkv", 3 * d, d)
        linear(p + "mixer.out_proj", d, d)
        linear(p + "mlp.fc1", inter, d)
        linear(p + "mlp.fc2", d, inter)
        norm(p + "norm1")
        norm(p + "norm2")
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(HF))
    make_tiny_tokenizer(folder)
    return state


def _effective(state, task: int | None) -> dict[str, torch.Tensor]:
    """Every parametrized weight as the parametrization computes it for ``task`` (None: the original)."""
    scale, out = HF["lora_alpha"] / HF["lora_rank"], {}
    for k, v in state.items():
        if k.endswith(ORIGINAL):
            stem = k.removesuffix(ORIGINAL)
            a, b = state[stem + A], state[stem + B]
            delta = 0 if task is None else (a[task] @ b[task] if "embeddings" in stem else b[task] @ a[task])
            out[stem.removeprefix("roberta.") + ".weight"] = v + scale * delta
        elif not k.endswith((A, B)):
            out[k.removeprefix("roberta.")] = v
    return out


def reference(state, task: int | None, seqs=SEQS) -> np.ndarray:
    """Mean-pooled, normalized embeddings of ``seqs`` as one padded batch."""
    w, d, heads = _effective(state, task), HF["hidden_size"], HF["num_attention_heads"]
    hd, n, L = d // heads, len(seqs), max(len(s) for s in seqs)
    ids = torch.tensor([s + [HF["pad_token_id"]] * (L - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs], dtype=torch.bool)  # (n, L)
    ln = lambda x, name: F.layer_norm(x, (d,), w[name + ".weight"], w[name + ".bias"], HF["layer_norm_eps"])  # noqa
    lin = lambda x, name: F.linear(x, w[name + ".weight"], w[name + ".bias"])  # noqa: E731
    x = ln(F.embedding(ids, w["embeddings.word_embeddings.weight"]) + w["embeddings.token_type_embeddings.weight"][0],
           "emb_ln")
    inv = 1.0 / HF["rotary_emb_base"] ** (torch.arange(0, hd, 2).float() / hd)
    angles = torch.arange(L).float()[:, None] * inv[None, :]  # (L, hd / 2)
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]  # (L, 1, hd)
    rot = lambda t: t * cos + torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], -1) * sin  # noqa: E731
    bias = torch.zeros(n, 1, 1, L).masked_fill(~mask[:, None, None, :], float("-inf"))
    for i in range(HF["num_hidden_layers"]):
        p = f"encoder.layers.{i}."
        q, k, v = lin(x, p + "mixer.Wqkv").view(n, L, 3, heads, hd).unbind(2)  # (n, L, heads, hd)
        q, k = rot(q).transpose(1, 2), rot(k).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, -1) @ v.transpose(1, 2)
        x = ln(x + lin(att.transpose(1, 2).reshape(n, L, d), p + "mixer.out_proj"), p + "norm1")
        x = ln(x + lin(F.gelu(lin(x, p + "mlp.fc1")), p + "mlp.fc2"), p + "norm2")
    mean = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return F.normalize(mean, dim=-1).numpy()


def _load(folder, **hf):
    return load_model(WorkerConfig(model=str(folder), served_model_name="j3", dtype="float32",
                                   max_batch_tokens=1024, hf_overrides=hf))


@pytest.mark.parametrize("task", [None, "retrieval.query", "retrieval.passage"])
def test_the_chosen_task_lora_is_merged_as_its_parametrization_computes(tmp_path, task):
    state = _checkpoint(tmp_path)
    model = _load(tmp_path, **({"jina_task": task} if task else {}))
    assert model.info.tasks[0] == "embed"
    want = reference(state, TASKS.index(task or "text-matching"))
    got = pool_ids(model, SEQS)
    assert worst_cosine(got, want) > 0.99999 and max_abs(got, want) < 1e-5, (worst_cosine(got, want),
                                                                             max_abs(got, want))
    assert max_abs(reference(state, None), want) > 1e-3  # the LoRA matters: merging it is what agrees


def test_an_unknown_task_or_a_lora_without_its_weight_is_refused(tmp_path):
    state = _checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"jina_task 'code' is not one of the model's lora_adaptations"):
        _load(tmp_path, jina_task="code")
    state.pop("roberta.encoder.layers.1.mlp.fc2" + B)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"without their LoRA pair.*layers\.1\.mlp\.fc2\.parametrizations"):
        _load(tmp_path)


def test_absolute_position_xlm_r_stays_bert_and_prenorm_is_refused(tmp_path, capsys):
    _checkpoint(tmp_path)
    assert poolgate(["inspect", str(tmp_path), "--dtype", "float32", "--backend", "cpu"]) == 0
    rows = {line[:14].strip(): line[16:] for line in capsys.readouterr().out.splitlines()}
    assert rows["architecture"] == "JinaRobertaModel" and rows["implementation"] == "packed jina_xlmr"
    assert rows["pooling"].startswith("MEAN (architecture default)")
    with pytest.raises(ValueError, match=r"prenorm=True"):
        _load(tmp_path, prenorm=True)
    assert poolgate(["inspect", str(tmp_path), "--dtype", "float32", "--backend", "cpu", "--hf-overrides",
                     '{"position_embedding_type": "absolute"}']) == 0
    assert "packed bert" in capsys.readouterr().out


def figures(tmp) -> list[tuple[str, float, float]]:
    state = _checkpoint(tmp)
    rows = []
    for i, task in enumerate(TASKS):
        got, want = pool_ids(_load(tmp, jina_task=task), SEQS), reference(state, i)
        rows.append((f"jina-embeddings-v3 jina_task={task}", worst_cosine(got, want), max_abs(got, want)))
    return rows


if __name__ == "__main__":
    print_figures(figures)
