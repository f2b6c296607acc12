"""Packed encoder families vs transformers, fp32: ``python -m tests.workers.encoder_families`` prints the table.

For BERT, RoBERTa, XLM-R, CamemBERT, DistilBERT and MPNet, tiny random checkpoints
(``*Model``, ``*ForSequenceClassification``, ``*ForTokenClassification``) are
made at run time. Compared on one batch of mixed lengths: the packed model's
hidden states against transformers' ``last_hidden_state`` (each sequence run
alone), and the served outputs (embed: CLS, normalized; classify: softmax of
the logits; token_classify: softmax per token) through poolgate's runner.
``tests/workers/test_encoder_families.py`` asserts cosine ≥ 0.9999 on the same
cases; this module prints the worst cosine and largest absolute difference.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.build import load_model
from poolgate.workers.kernels.ops import REFERENCE
from poolgate.workers.models import architecture_for, build_model
from poolgate.workers.batch.packing import pack
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.st_config import read_spec
from tests.fakes import save_random

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3], [2, 3], [2, 7, 7, 7, 7, 7, 7, 3], [2]]
FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "mpnet")
HEADS = {"model": AutoModel, "sequence_classification": AutoModelForSequenceClassification,
         "token_classification": AutoModelForTokenClassification}


def tiny_config(model_type: str, **extra):
    """A 2-layer, 32-wide config of ``model_type`` (pad id 0; 1 for MPNet, whose embeddings fix it)."""
    if model_type == "distilbert":
        sizes = dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64)
    else:
        sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    pad = 1 if model_type == "mpnet" else 0
    return AutoConfig.for_model(model_type, vocab_size=100, max_position_embeddings=66, pad_token_id=pad,
                                **sizes, **extra)


def save_tiny(folder: Path, model_type: str, head: str = "model", seed: int = 0, **extra):
    """Save a tiny random checkpoint with the word-level test tokenizer; returns transformers' model."""
    return save_random(folder, HEADS[head], tiny_config(model_type, **extra), seed=seed)


def packed_hidden(folder: Path, seqs=SEQS, token_types=None) -> torch.Tensor:
    """(n_tokens, hidden) from poolgate's packed model, all of ``seqs`` in one batch."""
    spec = read_spec(WorkerConfig(model=str(folder), served_model_name="t"))
    model, arch = build_model(spec, REFERENCE, allow_pickle=False)
    assert arch.packed, f"{spec.architecture} is not packed"
    with torch.no_grad():
        return model(pack(seqs, token_types=token_types))


def reference_hidden(model, seqs=SEQS, token_types=None) -> torch.Tensor:
    """transformers' last hidden states, one sequence at a time (no padding), concatenated."""
    base = model.base_model
    with torch.no_grad():
        return torch.cat([base(input_ids=torch.tensor([s]),
                               **({"token_type_ids": torch.tensor([t])} if token_types else {})).last_hidden_state[0]
                          for s, t in zip(seqs, token_types or [None] * len(seqs))])


def served(folder: Path, task: str, seqs=SEQS) -> list[np.ndarray]:
    """Rows poolgate's runner returns for ``task`` (fp32), one array per sequence."""
    cfg = WorkerConfig(model=str(folder), served_model_name="t", dtype="float32", max_batch_tokens=256)
    assert architecture_for(read_spec(cfg)).packed
    model = load_model(cfg)
    outputs = model.runner.execute(model.runner.prepare([Sequence(s, PoolingParams(task=task)) for s in seqs]))
    return [o.rows.item(i) for o in outputs for i in range(len(o.rows))]


def _logits(model, seqs=SEQS) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s])).logits[0] for s in seqs]


def cases(tmp: Path, model_type: str):
    """(what, got rows, want rows) for one family: hidden states, embed, classify, token_classify."""
    norm = torch.nn.functional.normalize
    enc = save_tiny(tmp / "enc", model_type)
    want = reference_hidden(enc)
    yield "hidden states", packed_hidden(tmp / "enc").numpy(), want.numpy()
    starts = np.cumsum([0, *map(len, SEQS)])[:-1]
    yield "embed (CLS)", np.stack(served(tmp / "enc", "embed")), norm(want[starts], dim=-1).numpy()
    cls = save_tiny(tmp / "cls", model_type, "sequence_classification", num_labels=3)
    yield ("classify (3 labels)", np.stack(served(tmp / "cls", "classify")),
           torch.softmax(torch.stack(_logits(cls)), -1).numpy())
    tok = save_tiny(tmp / "tok", model_type, "token_classification", num_labels=5)
    yield ("token_classify (5 labels)", np.concatenate(served(tmp / "tok", "token_classify")),
           torch.softmax(torch.cat(_logits(tok)), -1).numpy())


def agreement(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(worst row cosine, max |difference|) in float64."""
    a, b = np.atleast_2d(got).astype(np.float64), np.atleast_2d(want).astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min()), float(np.abs(a - b).max())


def main() -> None:
    print(f"{'family':12} {'output':26} {'worst cosine':>14} {'1 - cosine':>11} {'max |diff|':>11}")
    for model_type in FAMILIES:
        worst = 1.0
        with tempfile.TemporaryDirectory() as tmp:
            for what, got, want in cases(Path(tmp), model_type):
                cos, diff = agreement(got, want)
                worst = min(worst, cos)
                print(f"{model_type:12} {what:26} {cos:14.9f} {1 - cos:11.2e} {diff:11.2e}")
        print(f"{model_type:12} {'WORST':26} {worst:14.9f} {1 - worst:11.2e}")


if __name__ == "__main__":
    main()
