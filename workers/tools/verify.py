"""``poolgate verify``'s comparison: a loaded model's outputs against its reference on a fixed probe set.

The reference is the model's own library run in float32: sentence-transformers
for a sentence-transformers folder (``modules.json``), else transformers with
the model's pooling (``AutoModel`` + CLS / MEAN / LAST, normalized as served)
for embed, and ``AutoModelForSequenceClassification`` with the served
activation for classify. Token tasks are checked token by token, every token a
row: ``token_embed`` against transformers' last hidden states (normalized as
served), ``token_classify`` of a ``*ForTokenClassification`` checkpoint against
``AutoModelForTokenClassification`` with the served activation. Where something
verify does not reproduce sits between the model and the served rows (a Dense
projector, STEP pooling, calibration or kept columns, PyLate, a sequence
classifier's per-token twin) the task is skipped. The probes are short, long
(past the model's length, so both sides truncate), multilingual and
odd-character texts; poolgate runs them batched and one by one. Each row says,
for one task and dtype, the worst cosine and the largest absolute difference to
the reference, and the worst cosine between batched and single; a model passes
when every worst cosine is at least the threshold (a token task whose token
count differs from the reference's fails with -1). Tasks without a reference
here (those above, the special models) are named and skipped.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.runner_api import LoadedModel
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.st_config import ModelSpec

DEFAULT_THRESHOLD = 0.999
PROBES = (
    "a", "Hello world!", "The quick brown fox jumps over the lazy dog.",
    "Pooling models turn the hidden states of a whole prompt into one vector. " * 80,  # past most max lengths
    "Zürich, München, São Paulo, Kraków, Ångström", "東京は日本の首都です。", "Москва — столица России.",
    "emoji 🙂🚀 tabs\tand\nnew lines", "12345 67890 !!! ??? ... --- ###", "   leading and trailing spaces   ",
)
TASKS = ("embed", "classify", "token_embed", "token_classify")


@dataclass(frozen=True)
class Check:
    """One task in one dtype: agreement with the reference, and batched with single."""

    task: str
    dtype: str
    worst_cosine: float
    max_abs_diff: float
    batched_vs_single: float

    def passes(self, threshold: float) -> bool:
        return self.worst_cosine >= threshold and self.batched_vs_single >= threshold

    def line(self) -> str:
        return (f"{self.task:<14} {self.dtype:<9} worst cosine {self.worst_cosine:.6f}  max abs diff "
                f"{self.max_abs_diff:.2e}  batched vs single {self.batched_vs_single:.6f}")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n,) row cosines of two (n, dim) arrays (norms clamped at 1e-12)."""
    norms = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return (a * b).sum(1) / norms


def probe_ids(model: LoadedModel) -> list[list[int]]:
    """The probes as the worker tokenizes them, cut to the model's length."""
    return model.encoder.encode(list(PROBES), max_tokens=model.info.max_model_len)


def served(model: LoadedModel, ids: list[list[int]], task: str, *, batched: bool) -> np.ndarray:
    """(n, dim) float32 outputs of ``task`` for ``ids``, in one batch or one sequence per batch."""
    params = PoolingParams(task=task)
    runner = model.runner
    groups = [ids] if batched else [[x] for x in ids]
    rows = [o.rows.values for g in groups
            for o in runner.execute(runner.prepare([Sequence(list(x), params) for x in g]))]
    return np.concatenate(rows).astype(np.float32)


def check(model: LoadedModel, task: str, reference: np.ndarray, ids: list[list[int]]) -> Check:
    batched, single = served(model, ids, task, batched=True), served(model, ids, task, batched=False)
    apart = float(cosines(batched, single).min()) if batched.shape == single.shape else -1.0
    if batched.shape != reference.shape:  # a token task whose tokens are not the reference's: nothing agrees
        return Check(task, model.info.dtype, -1.0, float("inf"), apart)
    return Check(task, model.info.dtype, float(cosines(batched, reference).min()),
                 float(np.abs(batched - reference).max()), apart)


@torch.no_grad()
def reference_outputs(spec: ModelSpec, task: str) -> np.ndarray | None:
    """(n, dim) float32 reference outputs for the probes, or None where verify has no reference for ``task``."""
    from poolgate.workers.pooling.special import SPECIAL_MODELS

    if task not in TASKS or spec.architecture in SPECIAL_MODELS or spec.gguf_file:
        return None
    if task.startswith("token_"):
        return _transformers(spec, task) if _plain_tokens(spec, task) else None
    if task == "embed" and (Path(spec.path) / "modules.json").is_file():
        return _sentence_transformers(spec)
    return _transformers(spec, task)


def _sentence_transformers(spec: ModelSpec) -> np.ndarray:
    """sentence-transformers end to end (its own tokenizer and truncation), one text per batch."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(spec.path), device="cpu").float().eval()
    st.max_seq_length = spec.max_model_len
    return st.encode(list(PROBES), batch_size=1, convert_to_numpy=True, show_progress_bar=False).astype(np.float32)


def _transformers(spec: ModelSpec, task: str) -> np.ndarray:
    """transformers with the model's own tokenizer (truncated to the served length): its last hidden states with
    the served pooling (embed) or every token's (token_embed), normalized as served, or its classifier's logits
    through the served activation (classify: the sequence's; token_classify: every token's). (probes, dim); for a
    token task (probe tokens, dim), every token of every probe a row."""
    from transformers import (AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification,
                              AutoTokenizer)

    from poolgate.workers.pooling.for_model import sequence_pooling

    cls = {"classify": AutoModelForSequenceClassification,
           "token_classify": AutoModelForTokenClassification}.get(task, AutoModel)
    ref = cls.from_pretrained(str(spec.path), torch_dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(spec.path))
    method, out = sequence_pooling(spec)[0], []
    for text in PROBES:
        result = ref(**tokenizer(text, truncation=True, max_length=spec.max_model_len, return_tensors="pt"))
        if task in ("classify", "token_classify"):
            out.append(_activated(spec, result.logits.float())[0].numpy())  # (labels,) or (tokens, labels)
            continue
        rows = result.last_hidden_state[0].float()  # (tokens, hidden): token_embed's rows
        if task == "embed":
            rows = {"CLS": rows[0], "LAST": rows[-1], "MEAN": rows.mean(0)}[method]
        normalize = spec.normalize in (None, True)
        out.append((torch.nn.functional.normalize(rows, dim=-1) if normalize else rows).numpy())
    return np.concatenate(out) if task.startswith("token_") else np.stack(out)


def _activated(spec: ModelSpec, logits: torch.Tensor) -> torch.Tensor:
    """The classifier's logits as served: through its activation unless the pooler config turns it off."""
    from poolgate.workers.pooling.classify import activation_for

    return logits if spec.pooler.use_activation is False else activation_for(spec.hf_config)(logits)


def _plain_tokens(spec: ModelSpec, task: str) -> bool:
    """Whether ``task``'s rows are every token straight from the model's head, as transformers computes them:
    ALL pooling, no Dense projector, no calibration or kept columns, not PyLate; for token_classify, a
    ``*ForTokenClassification`` checkpoint (a sequence classifier's per-token rows have no such reference)."""
    from poolgate.workers.load.pylate import pylate_config
    from poolgate.workers.pooling.for_model import token_pooling

    p = spec.pooler
    plain = (token_pooling(spec) == "ALL" and not spec.dense and pylate_config(spec) is None
             and p.logit_mean is None and p.logit_sigma is None and not p.returned_token_ids
             and not spec.hf_config.get("classifier_from_token"))
    return plain and (task == "token_embed" or spec.kind == "token_classify")


def verify_loaded(model: LoadedModel, spec: ModelSpec) -> tuple[list[Check], list[str]]:
    """Every served task with a reference checked on the probes; and the tasks skipped."""
    ids = probe_ids(model)
    checks, skipped = [], []
    for task in model.info.tasks:
        reference = reference_outputs(spec, task)
        if reference is None:
            skipped.append(task)
        else:
            checks.append(check(model, task, reference, ids))
    return checks, skipped


def refuse_below(model: LoadedModel, spec: ModelSpec, threshold: float) -> None:
    """``--verify-on-start``: ValueError (start-up fails) when a served task is below ``threshold``."""
    checks, _ = verify_loaded(model, spec)
    failed = [c for c in checks if not c.passes(threshold)]
    if failed:
        raise ValueError(f"--verify-on-start: {spec.path} agrees with its reference below {threshold}: "
                         + "; ".join(c.line() for c in failed))
