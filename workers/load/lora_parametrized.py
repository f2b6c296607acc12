"""jina-embeddings-v3's task LoRAs, saved as torch parametrizations inside the checkpoint, merged at load.

jinaai/jina-embeddings-v3 stores every linear and embedding weight of its encoder as
``X.parametrizations.weight.original`` with the LoRA of each of its ``lora_adaptations``
stacked in ``X.parametrizations.weight.0.lora_A`` / ``lora_B``. ``Parametrized`` shows
that checkpoint as plain ``X.weight`` tensors with one task merged; ``jina_task``
(default ``text-matching``, the one vLLM merges) picks it, at ``lora_alpha / lora_rank``;
with ``per_request`` the originals are shown unmerged and ``loras`` gives every task's LoRA.
A LoRA without its weight, a weight without its LoRA pair, or shapes that fit neither
a linear nor an embedding are refused, naming the tensors.
"""
from __future__ import annotations

from pathlib import Path

import torch

from poolgate.workers.load.checkpoint import Indexed, Tensors, few
from poolgate.workers.load.weights import CheckpointError

PER_REQUEST = "per_request"  # jina_task: the base unmerged, each call's task LoRA applied (models.task_adapters)
ORIGINAL = ".parametrizations.weight.original"  # torch parametrizations, as jina-embeddings-v3 saves them
LORA_PARTS = (".parametrizations.weight.0.lora_A", ".parametrizations.weight.0.lora_B")


class Parametrized(Indexed):
    """A checkpoint saved with torch parametrizations (jina-embeddings-v3: ``X.parametrizations.weight.original``
    plus every task's LoRA stacked in ``...weight.0.lora_A`` / ``lora_B``) seen as plain ``X.weight`` tensors
    with task ``index`` merged: ``B[i] @ A[i]`` for a linear, ``A[i] @ B[i]`` for an embedding (its LoRA is stored
    transposed), times ``scale``."""

    def __init__(self, base: Tensors, index: int | None, scale: float):  # index None: the originals, unmerged
        self.base, self.index, self.scale, self.source = base, index, scale, base.source
        self._names = {}
        loras = {k for k in base if k.endswith(LORA_PARTS)}
        for k in base:
            if k.endswith(ORIGINAL):
                self._names[k.removesuffix(ORIGINAL) + ".weight"] = k
            elif k not in loras:
                self._names[k] = k
        stems = {k.removesuffix(ORIGINAL) for k in base if k.endswith(ORIGINAL)}
        wanted = {stem + part for stem in stems for part in LORA_PARTS}
        odd = sorted((wanted - loras) | (loras - wanted))
        if odd:
            raise CheckpointError(base.source, f"parametrized weights without their LoRA pair, or LoRA tensors "
                                               f"without a weight: {few(odd)}")
        wrong = [k for k in stems if self._kind(k) is None]
        if wrong:
            raise CheckpointError(base.source, f"LoRA shapes that fit neither a linear nor an embedding: {few(wrong)}")

    def _kind(self, stem: str) -> str | None:
        out, inp = self.base.shape(stem + ORIGINAL)
        (n_a, *a), (n_b, *b) = self.base.shape(stem + LORA_PARTS[0]), self.base.shape(stem + LORA_PARTS[1])
        if (self.index is not None and not -n_a <= self.index < n_a) or n_a != n_b:
            return None
        if b[0] == out and a[1] == inp and a[0] == b[1]:
            return "linear"  # A (r, in), B (out, r)
        return "embedding" if a[0] == out and b[1] == inp and a[1] == b[0] else None  # A (vocab, r), B (r, dim)

    def __getitem__(self, name: str) -> torch.Tensor:
        theirs = self._names[name]
        weight = self.base[theirs]
        if not theirs.endswith(ORIGINAL) or self.index is None:
            return weight
        stem = theirs.removesuffix(ORIGINAL)
        a, b = (self.base[stem + part][self.index].float() for part in LORA_PARTS)
        delta = b @ a if self._kind(stem) == "linear" else a @ b  # (out, in) / (vocab, dim)
        return (weight.float() + self.scale * delta).to(weight.dtype)

    def loras(self, count: int) -> list[dict[str, tuple[str, torch.Tensor, torch.Tensor]]]:
        """Per task index < ``count``, each parametrized weight's (kind, A, ``scale`` · B) by its plain name."""
        out: list[dict] = [{} for _ in range(count)]
        for name, theirs in self._names.items():
            if theirs.endswith(ORIGINAL):
                stem, kind = theirs.removesuffix(ORIGINAL), self._kind(theirs.removesuffix(ORIGINAL))
                a, b = (self.base[stem + part].float() for part in LORA_PARTS)
                if a.shape[0] < count:
                    raise CheckpointError(self.base.source, f"{stem}: LoRAs for {a.shape[0]} tasks, not {count}")
                for i in range(count):
                    out[i][name] = (kind, a[i], self.scale * b[i])
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        return self.base.shape(self._names[name])

    def was_read(self, name: str) -> bool:
        return name in self._names and self.base.was_read(self._names[name])


def jina_v3(weights: Tensors, folder: Path, hf: dict) -> Tensors:
    """jina-embeddings-v3 with config ``jina_task`` (default text-matching, the one vLLM merges) of its
    ``lora_adaptations`` merged, at ``lora_alpha / lora_rank``."""
    tasks = list(hf.get("lora_adaptations") or [])
    task = hf.get("jina_task", "text-matching")
    scale = float(hf.get("lora_alpha", 1)) / float(hf.get("lora_rank", 4))
    if task == PER_REQUEST:  # the originals; every task's LoRA applied per call (workers.models.task_adapters)
        return Parametrized(weights, None, scale)
    if task not in tasks:
        raise ValueError(f"jina_task {task!r} is not one of the model's lora_adaptations {tasks}")
    return Parametrized(weights, tasks.index(task), scale)
