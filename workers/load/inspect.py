"""What poolgate runs for a model folder, decided from its files and the flags: a ``Plan`` and its table.

``poolgate inspect MODEL`` prints the plan without loading weights or starting
anything; the worker logs the same table at start-up, with what only loading
settles filled in (the tasks the poolers serve, the dtype ``--dtype auto``
kept). The decisions are the builder's own (``workers.models.architecture_for``,
``workers.load.st_config.read_spec``, the backend's ``attention`` and token
budget), called here, not restated.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.backends import get_backend
from poolgate.workers.backends.base import Backend
from poolgate.workers.models import Architecture, architecture_for
from poolgate.workers.pooling.for_model import sequence_pooling, served_tasks, token_pooling
from poolgate.workers.pooling.special import SPECIAL_MODELS
from poolgate.workers.pooling.pylate import PYLATE_POOLING
from poolgate.workers.load.pylate import pylate_config
from poolgate.workers.load.st_config import ModelSpec, read_spec
from poolgate.workers.load.weights import weights_source
from poolgate.workers.load.media_build import DEFAULT_MEDIA_BATCH_TOKENS, media_family_of, read_config
from poolgate.workers.models.media import MediaFamily

ATTENTION_PATHS = {
    "grouped_sdpa": "SDPA per group of similar lengths (padding only inside a group)",
    "varlen_flash": "varlen flash attention (no padding)",
    "packed_cpu_attention": "poolgate's C kernel over the packed batch (no padding, no groups)",
}
FALLBACK_ATTENTION = "transformers' own, over a batch padded to its longest sequence"


@dataclass(frozen=True)
class Plan:
    """One model's serving decisions, as ``table`` prints them (field order = row order)."""

    model: str
    architecture: str
    implementation: str
    weights: str
    tasks: str
    pooling: str
    max_length: str
    dtype: str
    backend: str
    attention: str
    kernels: str
    token_budget: str
    cuda_graphs: str = "off"

    def table(self) -> str:
        width = max(len(f.name) for f in fields(self))
        return "\n".join(f"{f.name.replace('_', ' '):<{width}}  {getattr(self, f.name)}" for f in fields(self))


def _pooling(spec: ModelSpec) -> str:
    """The pooling as ``workers.pooling.for_model`` chooses it (a special model: its registry entry's)."""
    if spec.architecture in SPECIAL_MODELS:
        return SPECIAL_MODELS[spec.architecture].pooling
    if pylate_config(spec) is not None:
        return PYLATE_POOLING
    method, source = sequence_pooling(spec)
    normalize = "" if spec.kind != "embed" else (
        ", normalized" if spec.normalize in (None, True) else ", not normalized")
    return f"{method} ({source}){normalize}; token tasks {token_pooling(spec)}"


def _dtype(cfg: WorkerConfig, backend: Backend) -> tuple[str, torch.dtype]:
    """(what the plan says, the dtype whose attention path applies)."""
    if cfg.dtype != "auto":
        return cfg.dtype, getattr(torch, cfg.dtype)
    fast = backend.fast_dtype()
    name = str(fast).removeprefix("torch.")
    if fast == torch.float32:
        return "float32 (auto: no faster dtype on this hardware)", fast
    timed = " and it runs no slower than float32 on one batch timed at load" if backend.times_auto_dtype else ""
    return f"auto: {name} if the start-up probes stay at cosine >= 0.999 to float32{timed}, else float32", fast


def _attention(arch: Architecture, backend: Backend, dtype: torch.dtype, hf: dict) -> str:
    if not arch.packed:
        return FALLBACK_ATTENTION
    fn = backend.attention(dtype).__name__
    config = arch.family.config(hf)  # decoders say per checkpoint: causal or not, windows, soft-capping
    notes = ["causal" if getattr(config, "causal", arch.family.causal) else "bidirectional"]
    windows = sorted({w for w in getattr(config, "windows", ()) if w is not None})
    if windows:
        notes.append("sliding windows (left, right) " + ", ".join(map(str, windows)))
    if getattr(config, "softcap", None):
        notes.append("soft-capped logits through poolgate's exact grouped path")
    return f"{fn}: {ATTENTION_PATHS.get(fn, fn)}; {'; '.join(notes)}"


def _kernels(arch: Architecture, backend: Backend, dtype: torch.dtype) -> str:
    """What each op runs (``Backend.kernels``); transformers' own modules for the fallback."""
    if not arch.packed:
        return "transformers' own modules"
    return "; ".join(f"{op}: {what}" for op, what in backend.kernels(dtype).items())


def plan(cfg: WorkerConfig, backend: Backend | None = None, spec: ModelSpec | None = None) -> Plan:
    """The plan for ``cfg``'s model on ``backend`` (default: the one ``cfg.backend`` picks)."""
    backend = backend or get_backend(cfg.backend)
    family = media_family_of(cfg) if spec is None else None
    if family is not None:
        return _media_plan(cfg, backend, family)
    spec = spec or read_spec(cfg)
    arch = architecture_for(spec)
    dtype, torch_dtype = _dtype(cfg, backend)
    tasks = served_tasks(spec)
    return Plan(
        model=str(spec.path), architecture=spec.architecture, implementation=arch.implementation,
        weights=str(spec.path / spec.gguf_file) if spec.gguf_file else weights_source(spec.path),
        tasks=f"{', '.join(tasks)} (served as {spec.kind})", pooling=_pooling(spec),
        max_length=f"{spec.max_model_len} tokens", dtype=dtype, backend=backend.name,
        attention=_attention(arch, backend, torch_dtype, spec.hf_config), kernels=_kernels(arch, backend, torch_dtype),
        token_budget=_budget(cfg, backend), cuda_graphs=_graphs(cfg, arch, backend, torch_dtype),
    )


def _media_plan(cfg: WorkerConfig, backend: Backend, family: MediaFamily) -> Plan:
    """A media model's plan (``workers.load.media_build``): transformers' own model, padded, by its family."""
    hf = read_config(cfg) or {}
    tasks = ", ".join(family.tasks) or "settled at load"
    modalities = ", ".join(family.modalities) or "settled at load"
    dtype = "float32 (auto: media models are served in float32 unless --dtype says otherwise)" \
        if cfg.dtype == "auto" else cfg.dtype
    return Plan(
        model=cfg.model, architecture=hf["architectures"][0], implementation=f"media family {family.name}: "
        f"{family.implementation}; inputs: {modalities}", weights=weights_source(Path(cfg.model)), tasks=tasks,
        pooling=_media_pooling(family.tasks), max_length="the family's (at load)",
        dtype=dtype, backend=backend.name, attention=family.attention or FALLBACK_ATTENTION,
        kernels="transformers' own modules",
        token_budget=f"{cfg.max_batch_tokens or DEFAULT_MEDIA_BATCH_TOKENS} tokens per padded batch (an image "
        "counts its placeholder tokens)", cuda_graphs="off: graphs are for packed models")


MEDIA_POOLING = {
    "embed": "embed: the family's vector in each sequence's LAST row, normalized",
    "token_embed": "token_embed: every token's vector (ALL), as the family normalizes it",
    "classify": "classify: the logits in each sequence's LAST row, with the config's activation",
}


def _media_pooling(tasks: tuple[str, ...]) -> str:
    return "; ".join(MEDIA_POOLING[t] for t in tasks if t in MEDIA_POOLING) or "settled at load"


def _budget(cfg: WorkerConfig, backend: Backend) -> str:
    if cfg.max_batch_tokens is None and type(backend).batch_tokens is not Backend.batch_tokens:
        return "from the device's memory and the model's size at start (workers.backends.budget; logged)"
    return f"{cfg.max_batch_tokens or backend.default_batch_tokens} tokens per batch"


def _graphs(cfg: WorkerConfig, arch: Architecture, backend: Backend, dtype: torch.dtype) -> str:
    """--cuda-graphs as ``workers.engine.cuda_graphs.graphs_for`` will decide it (capture itself: at start)."""
    if not cfg.cuda_graphs:
        return "off (--cuda-graphs)"
    if backend.name != "cuda" or not arch.packed:
        return f"off: graphs are for packed models on the cuda backend, not {backend.name}"
    attention = backend.attention(dtype).__name__
    if attention != "varlen_flash":
        return f"off: {attention} plans groups per batch (graphs need varlen flash attention)"
    return "on: one graph per token bucket, captured at warm-up and as shapes come; other batches eager"


def settled(p: Plan, spec: ModelSpec, backend: Backend, *, tasks: tuple[str, ...], dtype: torch.dtype) -> Plan:
    """The plan once loading has settled the tasks and the dtype (the start-up log's table)."""
    arch = architecture_for(spec)
    return replace(p, tasks=", ".join(tasks), dtype=str(dtype).removeprefix("torch."),
                   attention=_attention(arch, backend, dtype, spec.hf_config), kernels=_kernels(arch, backend, dtype))
