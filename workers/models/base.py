"""The packed-model seam: the ``PackedModel`` protocol, a ``Family`` registry entry, and weight mapping.

A packed family is one file under ``workers/models/`` with a frozen config
dataclass (``from_hf(hf_config: dict)``) and an ``nn.Module`` that follows
``PackedModel``: built from that config and the backend's ops bundle
(``kernels.ops``: its linears, norms, RoPE and attention; no kernel choice in
the model), filled by ``load_weights(state, source)`` through an explicit name
map, and run as ``forward(batch) → (n_tokens, hidden)`` (after the final
norm, for decoders too). ``workers.models.ARCHITECTURES`` maps Hugging Face
architecture names to ``Family`` entries.

``load_mapped`` is the one loader every family uses: it pulls each of the
module's tensors from the checkpoint by the family's map, maps the old
TF-style ``LayerNorm.gamma/beta`` names, and raises ``CheckpointError``
naming the file and every missing, unexpected or mis-shaped tensor. Tensors
that belong to a head the family declares (a classifier, an MLM head, a
pooler) are not "unexpected": the poolers load them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from poolgate.workers.kernels.ops import Ops
from poolgate.workers.batch.packing import PackedBatch
from poolgate.workers.load.checkpoint import InMemory, Tensors, few, find_name
from poolgate.workers.load.weights import CheckpointError

HEAD_KINDS = frozenset({"model", "sequence_classification", "token_classification", "masked_lm", "causal_lm"})
BUFFER_SUFFIXES = ("position_ids", "rotary_emb.inv_freq", "attn.masked_bias", "attn.bias")  # saved buffers, not weights


@runtime_checkable
class PackedModel(Protocol):
    """What the runner, the builder and the backends may rely on in a packed model."""

    hidden_size: int

    def load_weights(self, state: Mapping[str, torch.Tensor], source: str) -> None:
        """Copy the checkpoint's tensors in by the family's explicit name map; raise ``CheckpointError``."""

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """Packed batch → (n_tokens, hidden) final hidden states."""

    @property
    def needs_groups(self) -> bool:
        """Whether its attention takes a relative bias or soft-capping, which only the grouped path runs
        (the runner then plans SDPA groups in ``prepare`` on every backend)."""


@dataclass(frozen=True)
class Family:
    """One packed family: how to read its config and build it, what it pools by default, which heads exist.

    ``prefixes`` are base-model prefixes stripped from checkpoint names
    (``bert.``, ``model.``) before ``load_weights`` sees them.
    """

    name: str
    config: Callable[[dict], object]  # the family's ConfigClass.from_hf
    model: Callable[[object, Ops], PackedModel]  # (config, the backend's ops bundle) → the model
    default_pooling: str
    heads: frozenset[str]
    prefixes: tuple[str, ...] = ()
    causal: bool = False  # decoders: LAST pooling, causal attention
    pooling_for: Callable[[dict], str] | None = None  # a default read from the config (ModernBERT classifiers)

    def pooling(self, hf: dict) -> str:
        """The default pooling for a checkpoint whose config is ``hf``."""
        return self.pooling_for(hf) if self.pooling_for is not None else self.default_pooling

    def __post_init__(self) -> None:
        unknown = set(self.heads) - HEAD_KINDS
        if unknown:
            raise ValueError(f"family {self.name}: unknown head kinds {sorted(unknown)}")


def load_mapped(module: torch.nn.Module, state: Mapping[str, torch.Tensor], names: Mapping[str, str | list[str]],
                source: str, *, ignore: tuple[str, ...] = (), dim: int = 0) -> None:
    """Fill ``module`` from ``state``: ``names`` maps each of the module's tensor names to a checkpoint
    name, or a list of names concatenated along ``dim`` (fused Q/K/V). Every module tensor must be mapped
    and found with the right shape; checkpoint names neither used, nor under an ``ignore`` prefix, nor
    read already by the model's heads (built first) are unexpected. All problems are collected into one
    ``CheckpointError`` before any tensor is read (shapes come from the checkpoint's header); then each
    tensor is read and copied in, one at a time."""
    tensors = state if isinstance(state, Tensors) else InMemory(state, source)
    own = module.state_dict()
    missing, shapes, used, plan = [], [], set(), {}
    unmapped = sorted(set(own) - set(names))
    if unmapped:
        raise CheckpointError(source, f"the model's name map misses {unmapped} (a bug in poolgate)")
    for ours, theirs in names.items():
        wanted = [theirs] if isinstance(theirs, str) else list(theirs)
        found = [find_name(tensors, name) for name in wanted]
        missing += [name for name, f in zip(wanted, found) if f is None]
        if None in found:
            continue
        used.update(found)
        shape = _joined_shape([tensors.shape(f) for f in found], dim)
        if shape != tuple(own[ours].shape):
            shapes.append(f"{'+'.join(wanted)}: checkpoint {shape or 'unjoinable'}, "
                          f"config expects {tuple(own[ours].shape)}")
        plan[ours] = found
    extra = sorted(k for k in tensors if k not in used and not k.startswith(ignore)
                   and not k.endswith(BUFFER_SUFFIXES) and not tensors.was_read(k))  # read: a head's (ColBERT's)
    problems = []
    if missing:
        problems.append(f"missing tensors {few(missing)}")
    if extra:
        problems.append(f"unexpected tensors {few(extra)}")
    if shapes:
        problems.append(f"shape mismatch: {few(shapes)}")
    if problems:
        raise CheckpointError(source, "; ".join(problems))
    with torch.no_grad():
        for ours, found in plan.items():  # one tensor (or one fused group) in memory at a time
            parts = [tensors[f] for f in found]
            own[ours].copy_(parts[0] if len(parts) == 1 else torch.cat(parts, dim))
    # where each tensor came from, fused along dim (per-request task adapters wrap by it: workers.models.task_adapters)
    module.checkpoint_names, module.checkpoint_fused_dim = {ours: tuple(f) for ours, f in plan.items()}, dim
    # and each one's shape (run-time LoRA adapters check theirs against it: workers.models.run_loras)
    module.checkpoint_shapes = {f: tuple(tensors.shape(f)) for found in plan.values() for f in found}


def _joined_shape(parts: list[tuple[int, ...]], dim: int) -> tuple[int, ...] | None:
    """The shape of ``parts`` concatenated along ``dim`` (None if they cannot be)."""
    if len(parts) == 1:
        return parts[0]
    rest = {p[:dim] + p[dim + 1:] for p in parts}
    if len(rest) != 1 or any(len(p) <= dim for p in parts):
        return None
    return parts[0][:dim] + (sum(p[dim] for p in parts),) + parts[0][dim + 1:]


# Our embedding tensors → transformers' names, shared by the BERT-style encoders (BERT, DistilBERT, MPNet).
EMBEDDING_NAMES: dict[str, str] = {
    "word.weight": "embeddings.word_embeddings.weight",
    "position.weight": "embeddings.position_embeddings.weight",
    "emb_norm.weight": "embeddings.LayerNorm.weight",
    "emb_norm.bias": "embeddings.LayerNorm.bias",
}


def layer_names(num_layers: int, prefix: str, qkv: tuple[str, str, str],
                layers: Mapping[str, str]) -> dict[str, str | list[str]]:
    """The name map of an encoder's stack of layers, ours ``layers.{i}.NAME.{weight,bias}`` → the checkpoint's
    ``prefix.format(i) + THEIRS.{weight,bias}``: ``qkv`` (the three projections, fused in that order) and
    each module of ``layers`` (ours → theirs). Every module has a weight and a bias."""
    names: dict[str, str | list[str]] = {}
    for i in range(num_layers):
        p, ours = prefix.format(i), f"layers.{i}."
        for kind in ("weight", "bias"):
            names[f"{ours}qkv.{kind}"] = [f"{p}{m}.{kind}" for m in qkv]
            names.update({f"{ours}{a}.{kind}": f"{p}{b}.{kind}" for a, b in layers.items()})
    return names
