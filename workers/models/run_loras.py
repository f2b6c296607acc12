"""Run-time LoRA adapters of one packed model: PEFT folders loaded and unloaded while it serves, applied per sequence.

Served with ``--max-loras N`` (N > 0), a packed model keeps up to N adapters
resident, each in a slot (0..N-1). ``load`` reads a PEFT LoRA folder
(``adapter_config.json`` + ``adapter_model.safetensors``, ``workers.load.lora.read_adapter``)
and refuses, naming why: a rank over ``--max-lora-rank``; ``modules_to_save``
(whole modules, such as a new classifier head, are not a low-rank delta); DoRA,
LoRA biases, rank or alpha patterns; a target the model does not run (a head,
an embedding) or a linear whose activation is fused into it (BERT's
``intermediate.dense``: the delta would have to go in before the activation);
shapes that do not fit. A full registry refuses the next load (no eviction: an
adapter in use never disappears under a client; unload one first).

Each adapter's A and ``scale · B`` are put on the targeted modules' wrappers
(``workers.models.task_adapters.LoraLinear``, shared with the jina per-request
tasks; a fused projection takes its parts stacked) in the model's dtype and
device. A call names its adapter in ``PoolingParams.lora``; the runner's
``prepare`` asks ``plan_params`` for each slot's token rows in the batch (the
base model's sequences take none), so one packed batch mixes adapters and the
base (segment LoRA; with several adapters in a batch, each wrapper runs them all in one masked product).
Unloading takes the name out of the loaded ones (a load may take its place at once) but keeps its slot's
weights for the calls already queued for it (the gateway routes none after it asks for the unload), until a
load needs the slot; a call whose adapter is gone fails, it never runs on the base weights.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import torch
from torch import nn

from poolgate.shared.domain.errors import InvalidRequest, ModelNotFound
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.lora import read_adapter
from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.models.task_adapters import ROW_SLOTS, LoraLinear, Plan, _stacked

PEFT_REFUSED = {  # adapter_config key → why a run-time adapter cannot have it
    "modules_to_save": "whole modules saved beside the LoRA (a new head) are not a low-rank delta; "
                       "serve the merged model instead",
    "use_dora": "DoRA rescales the merged weight, it is not a delta added to the base output",
    "bias": "LoRA biases are not applied at run time",
    "rank_pattern": "per-module ranks are not applied at run time",
    "alpha_pattern": "per-module alphas are not applied at run time",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D layouts) is not applied at run time",
}
ALLOWED = {"modules_to_save": None, "use_dora": False, "bias": "none", "rank_pattern": {}, "alpha_pattern": {},
           "fan_in_fan_out": False}


class RunLoras:
    """Name → slot of the adapters resident on ``model``; ``plan_params`` is the runner's prepare step."""

    def __init__(self, model: nn.Module, *, max_loras: int, max_rank: int, prefixes: tuple[str, ...]):
        if getattr(model, "task_adapters", None) is not None:
            raise ValueError("this model already serves per-request task adapters (jina_task: per_request); "
                             "run-time LoRA adapters cannot be added to it")
        if not hasattr(model, "checkpoint_shapes"):
            raise ValueError(f"{type(model).__name__} does not record its checkpoint names; it cannot take "
                             "run-time LoRA adapters")
        self.model, self.max_loras, self.max_rank = model, max_loras, max_rank
        self.prefixes, self.shape = prefixes, model.checkpoint_shapes.__getitem__
        self.slots: dict[str, int] = {}
        self.paths: dict[str, str] = {}
        # unloaded, oldest first: their slots keep their weights for the calls already queued, until a load needs one
        self.draining: dict[str, int] = {}
        self.lock = threading.Lock()
        model.task_adapters = self

    def load(self, name: str, folder: str | Path) -> None:
        """Read, check and place the adapter in ``folder`` under ``name``; InvalidRequest (400) naming why not."""
        folder = Path(folder)
        with self.lock:
            if name in self.slots:
                raise InvalidRequest(f"The lora adapter '{name}' has already been loaded.", param="lora_name")
            if len(self.slots) >= self.max_loras:
                raise InvalidRequest(f"{self.max_loras} LoRA adapters are loaded (--max-loras); unload one before "
                                     f"loading '{name}'", param="lora_name")
            per_module = self._read(folder)
            self.draining.pop(name, None)  # loaded anew: its queued calls run the new one
            free = sorted(set(range(self.max_loras)) - set(self.slots.values()) - set(self.draining.values()))
            slot = free[0] if free else self.draining.pop(next(iter(self.draining)))  # the oldest unloaded one's
            self._drop(slot)
            like = next(p for p in self.model.parameters() if p.is_floating_point())  # the model's dtype, device
            for path, (a, b) in per_module.items():
                self._wrapped(path).put(slot, a.to(like.device, like.dtype), b.to(like.device, like.dtype))
            self.slots[name], self.paths[name] = slot, str(folder)

    def unload(self, name: str) -> None:
        """Take ``name`` out; calls already queued for it still run it, until a load takes its slot."""
        with self.lock:
            slot = self.slots.pop(name, None)
            if slot is None:
                raise ModelNotFound(f"The lora adapter '{name}' cannot be found.", param="lora_name")
            self.paths.pop(name)
            self.draining[name] = slot

    def _drop(self, slot: int) -> None:
        for module in self.model.modules():
            if isinstance(module, LoraLinear):
                module.drop(slot)

    def _read(self, folder: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per module path of the model, the adapter's (A, s·B) in fp32, parts of a fused projection stacked."""
        config_path = folder / "adapter_config.json"
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"{config_path}: not a readable PEFT adapter config ({exc})") from None
        for key, why in PEFT_REFUSED.items():
            if config.get(key) not in (ALLOWED[key], None, [], {}):
                raise InvalidRequest(f"adapter {folder}: {key}={config[key]!r}: {why}")
        rank = config.get("r")
        if not isinstance(rank, int) or rank < 1:
            raise InvalidRequest(f"adapter {folder}: adapter_config.json's r={rank!r} is not a positive integer")
        if rank > self.max_rank:
            raise InvalidRequest(f"adapter {folder}: LoRA rank {rank} is greater than --max-lora-rank {self.max_rank}")
        try:
            adapter = read_adapter(folder)
        except (CheckpointError, KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"adapter {folder}: {exc}") from None
        odd = sorted(n for n, (a, b) in adapter.deltas.items() if not (a.is_floating_point() and b.is_floating_point()))
        if odd:
            raise InvalidRequest(f"adapter {folder}: LoRA tensors that are not floating point: {odd[:3]}")
        deltas = {self._base_name(n): ab for n, ab in adapter.deltas.items()}
        loras = {n: ("linear", a.float(), adapter.scale * b.float()) for n, (a, b) in deltas.items()}
        out, placed = {}, set()
        for ours, found in self.model.checkpoint_names.items():
            if not ours.endswith(".weight") or not any(f in loras for f in found):
                continue
            path = ours.removesuffix(".weight")
            module = self.model.get_submodule(path)
            base = module.base if isinstance(module, LoraLinear) else module
            activation = getattr(base, "activation", None)  # the kernels' linears say it; anything else is refused
            if activation != "none":
                raise InvalidRequest(f"adapter {folder}: {found[0]} is not a plain linear here (run with its "
                                     f"activation fused: {activation or type(base).__name__!r}); a LoRA on it is "
                                     "not applied at run time")
            for f in found:
                if f in loras:
                    _, a, b = loras[f]
                    if (b.shape[0], a.shape[1]) != tuple(self.shape(f)):
                        raise InvalidRequest(f"adapter {folder}: {f}: LoRA shape {(b.shape[0], a.shape[1])} does "
                                             f"not fit the weight's {tuple(self.shape(f))}")
            out[path] = _stacked(loras, found, self.shape, self.model.checkpoint_fused_dim, path)
            placed.update(f for f in found if f in loras)
        unplaced = sorted(set(loras) - placed)
        if unplaced:
            raise InvalidRequest(f"adapter {folder}: targets {unplaced[:3]} are not linears this packed model runs")
        return out

    def _base_name(self, name: str) -> str:
        for prefix in self.prefixes:
            if name.startswith(prefix):
                return name.removeprefix(prefix)
        return name

    def _wrapped(self, path: str) -> LoraLinear:
        module = self.model.get_submodule(path)
        if isinstance(module, LoraLinear):
            return module
        wrapped = LoraLinear(module, {})
        parent, _, leaf = path.rpartition(".")
        setattr(self.model.get_submodule(parent) if parent else self.model, leaf, wrapped)
        return wrapped

    def plan_params(self, params: list[PoolingParams], cu_seqlens: np.ndarray | torch.Tensor) -> Plan:
        """Per slot in the batch, its sequences' token rows (None: every row); the base's sequences take none."""
        spans: dict[int, list[tuple[int, int]]] = {}
        cu = [int(c) for c in cu_seqlens]
        for i, p in enumerate(params):
            if p.lora is None:
                continue
            slot = self.slots.get(p.lora, self.draining.get(p.lora))
            if slot is None:
                raise ModelNotFound(f"The lora adapter '{p.lora}' is not loaded on this worker.", param="model")
            spans.setdefault(slot, []).append((cu[i], cu[i + 1]))
        if len(spans) == 1 and sum(b - a for a, b in next(iter(spans.values()))) == cu[-1]:
            return [(next(iter(spans)), None)]
        plan: Plan = [(t, torch.from_numpy(np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in s])))
                      for t, s in spans.items()]
        if len(spans) > 1:  # several adapters: each row's slot, for the wrappers' one masked product
            row_slots = np.full(cu[-1], -1, dtype=np.int64)
            for t, s in spans.items():
                for a, b in s:
                    row_slots[a:b] = t
            plan.append((ROW_SLOTS, torch.from_numpy(row_slots)))
        return plan
