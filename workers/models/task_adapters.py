"""Per-request task adapters: the base weights unmerged, every task's LoRA on the device, applied per row segment.

Merged at load stays the default (``workers.load.lora``: one task fixed per served
model, as vLLM does). Served with ``--hf-overrides '{"jina_task": "per_request"}'``,
jina-embeddings-v3 (``JinaRobertaModel``) and -v5 (``JinaEmbeddingsV5Model``) load their
base weights as saved and keep each task's LoRA A and ``scale · B`` as buffers:
``attach`` wraps every LoRA-targeted linear (``LoraLinear``) and embedding
(``LoraEmbedding``, v3) of the built model, found by the checkpoint names
``load_mapped`` recorded, so no family changes. A fused projection (our ``qkv``,
``gate_up``) takes its parts' LoRAs stacked: A's rows concatenated, B block-diagonal
(zero where a part is not targeted), which is exactly the sum of the parts' deltas.

A call names its task in ``PoolingParams.adapter`` (Jina's ``task`` on /v1/embeddings;
``shared.domain.limits`` refuses a name the model lacks); None is the model's default task (the
one merged at load without an override). The runner's ``prepare`` calls ``plan``: per task
in the batch, the row index tensor of its sequences' tokens (None: the whole batch), uploaded
with the batch. ``execute`` runs the forward inside ``active(plan)``; each wrapped linear adds
``(x[rows] @ A_t.T) @ (s·B_t).T`` to those rows (segment LoRA), each wrapped embedding
``A_t[ids[rows]] @ (s·B_t)``. The plan is thread-local, since the CPU core threads run parts of a
batch at once on one model; a wrapped module run without a plan raises rather than answering
with the bare base weights.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.lora import Lora

Plan = list[tuple[int, "torch.Tensor | None"]]  # (task index, its token rows (n_t,) int64, None = every row)
ROW_SLOTS = -1  # a plan entry (ROW_SLOTS, (n_tokens,) int64 each row's slot, -1 = none): run_loras' mixed batches
_ACTIVE = threading.local()


@contextmanager
def active(plan: Plan | None) -> Iterator[None]:
    """Run the forward inside with ``plan`` (the batch's ``adapter_rows``) as this thread's."""
    saved = getattr(_ACTIVE, "plan", None)
    _ACTIVE.plan = plan
    try:
        yield
    finally:
        _ACTIVE.plan = saved


def _plan() -> Plan:
    plan = getattr(_ACTIVE, "plan", None)
    if plan is None:
        raise RuntimeError("a per-request adapter model ran without its batch's adapter plan (a bug in poolgate)")
    return plan


class _TaskLora(nn.Module):
    """``base(x)`` plus, on each planned task's rows, that task's low-rank ``delta``; the A/B of every task are
    buffers ``a{t}`` / ``b{t}`` (scale folded into B)."""

    def __init__(self, base: nn.Module, loras: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        super().__init__()
        self.base, self.tasks = base, set[int]()
        for t, (a, b) in loras.items():
            self.put(t, a, b)

    def put(self, t: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """Slot ``t`` runs ``a``/``b`` from now on (run-time adapters: ``workers.models.run_loras``)."""
        self.register_buffer(f"a{t}", a.contiguous())
        self.register_buffer(f"b{t}", b.contiguous())
        self.tasks.add(t)

    def drop(self, t: int) -> None:
        """Slot ``t`` adds nothing from now on; its buffers go."""
        self.tasks.discard(t)
        for name in (f"a{t}", f"b{t}"):
            self._buffers.pop(name, None)

    def delta(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def add_all(self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``y`` plus the delta on every row."""
        return y + self.delta(x, a, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # (n, out)
        for t, rows in _plan():
            if t in self.tasks:
                a, b = getattr(self, f"a{t}"), getattr(self, f"b{t}")
                if rows is None:
                    y = self.add_all(y, x, a, b)
                else:
                    y.index_add_(0, rows, self.delta(x[rows], a, b))  # (n_t, out) onto the task's rows
        return y


class LoraLinear(_TaskLora):
    """x: (n, in) → (n, out); A (r, in), B (out, r): ``(x @ A.T) @ B.T``.

    A plan with a ``ROW_SLOTS`` entry (run-time adapters mixed in one batch: ``workers.models.run_loras``)
    runs every adapter of the batch at once, with no row gathers: ``((x @ A_all.T) ⊙ mask) @ B_all.T``, A's
    rows and B's columns of the adapters concatenated, the mask keeping on each row its own adapter's columns.
    """

    def __init__(self, base: nn.Module, loras: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        super().__init__(base, loras)
        self.joined: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def put(self, t: int, a: torch.Tensor, b: torch.Tensor) -> None:
        super().put(t, a, b)
        self.joined = {}

    def drop(self, t: int) -> None:
        super().drop(t)
        self.joined = {}

    def delta(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (x @ a.T) @ b.T

    def add_all(self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return y.addmm_(x @ a.T, b.T)  # in place: no (n, out) delta to allocate and add

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plan = _plan()
        row_slots = next((rows for t, rows in plan if t == ROW_SLOTS), None)
        mine = tuple(t for t, _ in plan if t in self.tasks)
        if row_slots is None or len(mine) < 2:
            return super().forward(x)
        a, b, cols = self._joined(mine)  # (R, in), (out, R), (R,) the slot of each column
        xa = x @ a.T  # (n, R); rows past the batch's tokens (a bucket's padding) take no adapter
        n = row_slots.shape[0]
        xa[:n].mul_(row_slots[:, None] == cols[None, :])
        xa[n:].zero_()
        return self.base(x).addmm_(xa, b.T)  # (n, out)

    def _joined(self, slots: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        joined = self.joined.get(slots)
        if joined is None:
            a = [getattr(self, f"a{t}") for t in slots]
            b = torch.cat([getattr(self, f"b{t}") for t in slots], 1)
            cols = torch.cat([torch.full((p.shape[0],), t, dtype=torch.int64, device=b.device)
                              for t, p in zip(slots, a)])
            joined = self.joined[slots] = (torch.cat(a), b, cols)
        return joined


class LoraEmbedding(_TaskLora):
    """ids: (n,) → (n, dim); A (vocab, r), B (r, dim): ``A[ids] @ B``."""

    def delta(self, ids: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a[ids] @ b


class TaskAdapters:
    """A model's task names (index = buffer suffix) and its default; ``plan`` is the prepare step."""

    def __init__(self, names: list[str], default: str):
        self.names, self.index = list(names), {n: i for i, n in enumerate(names)}
        if default not in self.index:
            raise ValueError(f"default task {default!r} is not one of the model's tasks {self.names}")
        self.default = default

    def plan_params(self, params: list[PoolingParams], cu_seqlens: np.ndarray | torch.Tensor) -> Plan:
        """``plan`` for the batch's sequences' params (each names its task in ``adapter``)."""
        if any(p.lora is not None for p in params):
            raise ValueError("a call names a run-time LoRA adapter; this model serves per-request task adapters")
        return self.plan([p.adapter for p in params], cu_seqlens)

    def plan(self, adapters: list[str | None], cu_seqlens: np.ndarray | torch.Tensor) -> Plan:
        """Per task of the batch's sequences (``adapters``: each one's, None = default), its token rows."""
        spans: dict[int, list[tuple[int, int]]] = {}
        cu = [int(c) for c in cu_seqlens]
        for i, name in enumerate(adapters):
            t = self.index.get(name or self.default)
            if t is None:
                raise ValueError(f"task {name!r} is not one of the model's tasks {self.names}")
            spans.setdefault(t, []).append((cu[i], cu[i + 1]))
        if len(spans) == 1:
            return [(next(iter(spans)), None)]
        return [(t, torch.from_numpy(np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in s])))
                for t, s in spans.items()]


def attach(model: nn.Module, loras: dict[str, dict[str, Lora]], default: str,
           shape: Callable[[str], tuple[int, ...]]) -> TaskAdapters:
    """Wrap every module of ``model`` whose checkpoint tensors a task's LoRA targets; ``shape`` gives a
    checkpoint tensor's shape (an untargeted part of a fused projection). Sets ``model.task_adapters``."""
    names = list(loras)
    placed: set[str] = set()
    for ours, found in model.checkpoint_names.items():
        if not ours.endswith(".weight") or not any(f in task for task in loras.values() for f in found):
            continue
        path = ours.removesuffix(".weight")
        module = model.get_submodule(path)
        per_task = {i: _stacked(loras[n], found, shape, model.checkpoint_fused_dim, path)
                    for i, n in enumerate(names) if any(f in loras[n] for f in found)}
        kinds = {task[f][0] for task in loras.values() for f in found if f in task}
        if kinds == {"embedding"} and isinstance(module, nn.Embedding):
            wrapped: nn.Module = LoraEmbedding(module, per_task)
        elif kinds == {"linear"} and getattr(module, "activation", "none") == "none" and not isinstance(
                module, nn.Embedding):
            wrapped = LoraLinear(module, per_task)
        else:
            raise ValueError(f"{path}: a {'/'.join(sorted(kinds))} LoRA on {type(module).__name__} "
                             f"(activation {getattr(module, 'activation', 'none')!r}) cannot be applied per request")
        parent, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, wrapped)
        placed.update(found)
    unplaced = sorted({f for task in loras.values() for f in task} - placed)
    if unplaced:
        raise ValueError(f"task LoRAs on tensors the model does not run: {unplaced[:5]}")
    model.task_adapters = TaskAdapters(names, default)
    return model.task_adapters


def _stacked(task: dict[str, Lora], found: tuple[str, ...], shape, dim: int,
             path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One task's LoRA on a module loaded from ``found`` (fused along ``dim``): (A, s·B), parts stacked."""
    if len(found) == 1:
        _, a, b = task[found[0]]
        return a, b
    if dim != 0:
        raise ValueError(f"{path}: per-request LoRA on a projection fused along dim {dim}")
    parts = [(task.get(f), shape(f)[0]) for f in found]
    a = torch.cat([lora[1] for lora, _ in parts if lora is not None])  # (sum r, in)
    b = torch.zeros(sum(out for _, out in parts), a.shape[0])  # (sum out, sum r), block-diagonal
    row = col = 0
    for lora, out in parts:
        if lora is not None:
            r = lora[1].shape[0]
            b[row:row + out, col:col + r] = lora[2]
            col += r
        row += out
    return a, b
