"""Task LoRA adapters merged into a checkpoint's weights at load (jina-embeddings-v5's ``adapters/<task>/``, v3's
parametrizations).

jina-embeddings-v5-text-small is a Qwen3 body plus one PEFT LoRA adapter per
task (``adapters/<task>/adapter_config.json`` + ``adapter_model.safetensors``;
the tasks are config.json's ``task_names``). As vLLM does, one adapter is merged
into the base weights when the model loads, chosen with ``--hf-overrides
'{"jina_task": "..."}'`` (default ``retrieval``): ``W + s · B @ A`` with
``s = lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``), in fp32, then cast
back. ``Merged`` is a view of the checkpoint handle: a targeted tensor is merged
when read, everything else passes through. An adapter this file cannot merge
exactly (DoRA, LoRA biases, per-module rank or alpha patterns, modules saved
whole, tensors other than ``lora_A``/``lora_B``) or one whose target the
checkpoint does not have is refused, naming the file and the setting or tensor.

jina-embeddings-v3 keeps its task LoRAs inside the checkpoint (``workers.load.lora_parametrized``).
With ``jina_task: "per_request"`` nothing is merged: ``task_loras`` reads every task's LoRA for
``workers.models.task_adapters``, which applies the one each call names.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from poolgate.workers.load.checkpoint import Tensors, few, read_file
from poolgate.workers.load.lora_parametrized import PER_REQUEST, Parametrized, jina_v3
from poolgate.workers.load.weights import CheckpointError

PEFT_PREFIXES = ("base_model.model.", "model.")  # PEFT's wrapper, then a *For* model's body
PARTS = {".lora_A.weight": "A", ".lora_B.weight": "B"}
UNMERGEABLE = {"use_dora": False, "fan_in_fan_out": False, "bias": "none", "modules_to_save": None,
               "rank_pattern": {}, "alpha_pattern": {}}  # adapter_config key → the only value merged here


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter: per base weight name, its ``A`` (r, in) and ``B`` (out, r); ``scale`` multiplies B @ A."""

    source: str
    scale: float
    deltas: dict[str, tuple[torch.Tensor, torch.Tensor]]


def read_adapter(folder: Path) -> Adapter:
    """The PEFT LoRA adapter saved in ``folder``, checked to be one ``W + scale * B @ A`` merges exactly."""
    config_path, weights_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise CheckpointError(path, "the task adapter's file is missing")
    config = json.loads(config_path.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise CheckpointError(config_path, f"peft_type {config['peft_type']!r}: only LORA adapters are merged")
    for key, merged in UNMERGEABLE.items():
        if config.get(key, merged) not in (merged, None, [], {}):
            raise CheckpointError(config_path, f"{key}={config[key]!r} cannot be merged into the weights")
    rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    odd = []
    for name, tensor in read_file(weights_path, allow_pickle=False).items():
        suffix = next((s for s in PARTS if name.endswith(s)), None)
        if suffix is None:
            odd.append(name)
            continue
        parts.setdefault(_base_name(name[: -len(suffix)]) + ".weight", {})[PARTS[suffix]] = tensor
    unpaired = sorted(name for name, p in parts.items() if set(p) != {"A", "B"})
    if odd or unpaired:
        raise CheckpointError(weights_path, f"tensors that are not LoRA A/B pairs: {few(odd + unpaired)}")
    return Adapter(str(weights_path), scale, {name: (p["A"], p["B"]) for name, p in parts.items()})


def _base_name(name: str) -> str:
    for prefix in PEFT_PREFIXES:
        name = name.removeprefix(prefix)
    return name


class Merged(Tensors):
    """``base`` (the base-model view, prefix stripped) with ``adapter`` merged into the tensors it targets."""

    def __init__(self, base: Tensors, adapter: Adapter):
        missing = sorted(set(adapter.deltas) - set(base))
        if missing:
            raise CheckpointError(adapter.source, f"adapter targets not in {base.source}: {few(missing)}")
        wrong = sorted(name for name, (a, b) in adapter.deltas.items()
                       if (b.shape[0], a.shape[1]) != tuple(base.shape(name)) or a.shape[0] != b.shape[1])
        if wrong:
            raise CheckpointError(adapter.source, f"adapter shapes do not fit their weights: {few(wrong)}")
        self.base, self.adapter, self.source = base, adapter, base.source

    def __getitem__(self, name: str) -> torch.Tensor:
        weight = self.base[name]
        if name not in self.adapter.deltas:
            return weight
        a, b = self.adapter.deltas[name]
        return (weight.float() + self.adapter.scale * (b.float() @ a.float())).to(weight.dtype)  # (out, in)

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)

    def __contains__(self, name: object) -> bool:
        return name in self.base

    def shape(self, name: str) -> tuple[int, ...]:
        return self.base.shape(name)

    def was_read(self, name: str) -> bool:
        return self.base.was_read(name)


def jina_v5(weights: Tensors, folder: Path, hf: dict) -> Tensors:
    if hf.get("jina_task") == PER_REQUEST:
        return weights
    return Merged(weights, read_adapter(jina_v5_adapter(folder, hf)))


def jina_v5_adapter(folder: Path, hf: dict) -> Path:
    """jina-embeddings-v5's adapter folder for config ``jina_task`` (default ``retrieval``), one of ``task_names``."""
    task = hf.get("jina_task", "retrieval")
    tasks = hf.get("task_names")
    if tasks is not None and task not in tasks:
        raise ValueError(f"jina_task {task!r} is not one of the model's task_names {list(tasks)}")
    return folder / "adapters" / task


# architecture → (the base-model view of its checkpoint, its folder, its config) → that view, its task merged
TASK_ADAPTERS: dict[str, Callable[[Tensors, Path, dict], Tensors]] = {
    "JinaEmbeddingsV5Model": jina_v5, "JinaRobertaModel": jina_v3}


DEFAULT_TASKS = {"JinaEmbeddingsV5Model": "retrieval", "JinaRobertaModel": "text-matching"}
TASK_LISTS = {"JinaEmbeddingsV5Model": "task_names", "JinaRobertaModel": "lora_adaptations"}  # config keys
# ("linear", A (r, in), s·B (out, r)) or ("embedding", A (vocab, r), s·B (r, dim)): scale s folded into B
Lora = tuple[str, torch.Tensor, torch.Tensor]


def adapter_names(architecture: str, hf: dict) -> tuple[str, ...] | None:
    """The tasks a call may name (``ModelInfo.adapters``): every one served per request, else the merged one."""
    if architecture not in TASK_ADAPTERS:
        return None
    task = hf.get("jina_task", DEFAULT_TASKS[architecture])
    return tuple(hf.get(TASK_LISTS[architecture]) or ()) if task == PER_REQUEST else (task,)


def task_loras(weights: Tensors, architecture: str, folder: Path, hf: dict) -> dict[str, dict[str, Lora]]:
    """Per task (in the config's order), its LoRA by base weight name, scale folded into B, in fp32;
    ``weights`` is the unmerged view ``with_task_adapter`` gave for ``jina_task: per_request``."""
    tasks = list(hf.get(TASK_LISTS[architecture]) or ())
    if not tasks:
        raise ValueError(f"jina_task per_request needs the model's {TASK_LISTS[architecture]} in config.json")
    if isinstance(weights, Parametrized):
        return dict(zip(tasks, weights.loras(len(tasks))))
    out = {}
    for task in tasks:
        adapter = read_adapter(folder / "adapters" / task)
        Merged(weights, adapter)  # refuses targets the checkpoint lacks, or shapes that do not fit
        out[task] = {name: ("linear", a.float(), adapter.scale * b.float()) for name, (a, b) in adapter.deltas.items()}
    return out


def with_task_adapter(weights: Tensors, architecture: str, folder: Path, hf: dict) -> Tensors:
    """``weights`` with the architecture's task adapter merged, or unchanged for an architecture without one."""
    merge = TASK_ADAPTERS.get(architecture)
    return weights if merge is None else merge(weights, folder, hf)
