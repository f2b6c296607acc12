"""Tiny random ModernBERT / GTE / NomicBERT checkpoints and their comparison with transformers (fp32).

Shared by the golden tests and ``python -m tests.workers.rope_encoders``, which
prints the worst cosine per family and output. Checkpoints use a larger init
than transformers' default so that a wrong mask or rotary shows in the outputs;
ModernBERT gets a local window of 8 (half-window 4) and distinct global/local
rope thetas, and the sequences run past the window.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.kernels.attention import grouped_sdpa
from poolgate.workers.kernels.ops import Ops
from poolgate.workers.models import build_model
from poolgate.workers.batch.packing import pack
from poolgate.workers.load.st_config import read_spec
from tests.fakes import make_tiny_tokenizer

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 45)) + [3], [2, 3], [2] + [7] * 20 + [3],
        [2] + list(range(90, 60, -1)) + [3]]
TINY = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, intermediate_size=48, initializer_range=0.2)
CONFIGS = {
    "modernbert": dict(num_hidden_layers=4, local_attention=8, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                       cls_token_id=2, sep_token_id=3, global_rope_theta=1000.0, local_rope_theta=50.0,
                       max_position_embeddings=128, initializer_cutoff_factor=3.0),
    "gte": dict(num_hidden_layers=2, type_vocab_size=2, pad_token_id=0, rope_theta=500.0,
                max_position_embeddings=128),
    "nomic_bert": dict(num_hidden_layers=2, pad_token_id=0, max_position_embeddings=128),
}


def save(folder: Path, model_type: str, auto, **extra):
    """A tiny random ``auto`` model of ``model_type`` saved (safetensors + word-level tokenizer) into ``folder``."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **{**TINY, **CONFIGS[model_type], **extra})
    torch.manual_seed(0)
    model = auto.from_config(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    make_tiny_tokenizer(folder)
    return model


def to_hub_modernbert_config(folder: Path) -> None:
    """Rewrite a transformers-5 ModernBERT config.json into the Hub's older form (global_attn_every_n_layers,
    global/local_rope_theta instead of layer_types and rope_parameters)."""
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    types, rope = hf.pop("layer_types"), hf.pop("rope_parameters")
    assert types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    hf.update(global_attn_every_n_layers=3, global_rope_theta=rope["full_attention"]["rope_theta"],
              local_rope_theta=rope["sliding_attention"]["rope_theta"])
    path.write_text(json.dumps(hf))


def packed_model(folder: Path, attention=grouped_sdpa):
    spec = read_spec(WorkerConfig(model=str(folder), served_model_name="t"))
    model, arch = build_model(spec, Ops(attention=attention), allow_pickle=False)
    assert arch.packed, spec.architecture
    return model


def packed_hidden(model, seqs=SEQS) -> torch.Tensor:
    with torch.no_grad():
        return model(pack(seqs))  # (n_tokens, hidden)


def reference_hidden(model, seqs=SEQS) -> torch.Tensor:
    """transformers' own forward, one unpadded sequence at a time."""
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs])


def reference_logits(model, seqs=SEQS) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s])).logits[0] for s in seqs]


def worst_cosine(a, b) -> float:
    """The smallest row-wise cosine between two (rows, dim) arrays."""
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def cls_rows(hidden: torch.Tensor, seqs=SEQS) -> torch.Tensor:
    starts = np.cumsum([0] + [len(s) for s in seqs[:-1]])
    return hidden[torch.as_tensor(starts)]


def mean_rows(hidden: torch.Tensor, seqs=SEQS) -> torch.Tensor:
    return torch.stack([part.mean(0) for part in hidden.split([len(s) for s in seqs])])


def max_abs(a, b) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def print_figures(figures, width: int = 50) -> None:
    """A model test module's ``python -m``: its ``figures(folder)`` rows (label, worst cosine, max abs
    difference), made in a temporary folder, one a line."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for label, cos, diff in figures(Path(tmp)):
            print(f"{label:<{width}} {cos:.9f} {diff:.2e}")


def figures(tmp: Path) -> list[tuple[str, str, float, float]]:
    """(family, output, worst cosine, max abs difference) vs transformers for every family and head."""
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

    from poolgate.shared.domain.params import PoolingParams
    from tests.workers.pooled import pool_ids
    from poolgate.workers.load.build import load_model

    rows = []
    for family in CONFIGS:
        folder = tmp / family
        ref = save(folder, family, AutoModel)
        got, want = packed_hidden(packed_model(folder)), reference_hidden(ref)
        rows += [(family, "hidden states", worst_cosine(got, want), max_abs(got, want)),
                 (family, "CLS pooled", worst_cosine(cls_rows(got), cls_rows(want)),
                  max_abs(cls_rows(got), cls_rows(want))),
                 (family, "MEAN pooled", worst_cosine(mean_rows(got), mean_rows(want)),
                  max_abs(mean_rows(got), mean_rows(want)))]
        heads = [(AutoModelForSequenceClassification, "classify", {}),
                 (AutoModelForTokenClassification, "token_classify", {})]
        if family == "modernbert":
            heads.insert(1, (AutoModelForSequenceClassification, "classify", {"classifier_pooling": "mean"}))
        for n, (auto, task, extra) in enumerate(heads):
            folder = tmp / f"{family}-{n}"
            ref = save(folder, family, auto, num_labels=3, **extra)
            model = load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32",
                                            max_batch_tokens=512))
            got = pool_ids(model, SEQS, PoolingParams(task=task, use_activation=False))
            want = torch.cat([torch.atleast_2d(x) for x in reference_logits(ref)]).numpy()
            label = f"{task} logits" + (f" ({extra['classifier_pooling']})" if extra else "")
            rows.append((family, label, worst_cosine(got, want), max_abs(got, want)))
    return rows


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        table = figures(Path(tmp))
    print(f"{'family':<12} {'output':<29} {'worst fp32 cosine':>18} {'max abs diff':>13}   (vs transformers 5.24)")
    for family, output, cos, diff in table:
        print(f"{family:<12} {output:<29} {cos:>18.9f} {diff:>13.2e}")
