"""Embedding heads: sentence-transformers Dense projection → matryoshka slice → L2 normalize; raw rows."""
from __future__ import annotations

import torch
from torch import nn

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.kernels.pooling import L2Cut, l2_cut
from poolgate.workers.load.checkpoint import Checkpoint
from poolgate.workers.load.st_config import DenseSpec
from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.pooling.classify import torch_activation
from poolgate.workers.pooling.sources import PoolerSources


def load_dense(spec: DenseSpec, *, allow_pickle: bool) -> nn.Module:
    """One Dense module as Linear + activation, from its folder's weights."""
    linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
    weights = Checkpoint.open(spec.path, allow_pickle=allow_pickle)
    linear.load_state_dict({k.removeprefix("linear."): weights[k].float() for k in weights})
    weights.close()
    return nn.Sequential(linear, torch_activation(spec.activation, "Dense activation"))


def linear_projection(src: PoolerSources, name: str, checkpoint: str, config_key: str) -> nn.Linear:
    """The checkpoint's bias-free ``name`` weight (dim, hidden) as an fp32 Linear on the device; its rows must match
    config.json's ``config_key`` where it is set. ``checkpoint`` names the kind in the errors ("an HF_ColBERT ...")."""
    if name not in src.weights:
        raise CheckpointError(src.weights.source, f"{checkpoint} checkpoint needs its projection {name}")
    weight = src.weights[name].float()  # (dim, hidden)
    dim = src.spec.hf_config.get(config_key)
    if dim is not None and int(dim) != weight.shape[0]:
        raise CheckpointError(src.weights.source, f"{name} projects to {weight.shape[0]} dimensions, but "
                                                  f"config.json says {config_key}={dim}")
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.load_state_dict({"weight": weight})
    return linear.eval().to(src.device)


class EmbedHead(nn.Module):
    """(k, hidden) fp32 pooled states of sequences that share params → (k, dim) vectors."""

    def __init__(self, projector: nn.Module | None, normalize_default: bool, dimensions: int | None = None, *,
                 l2_cut: L2Cut = l2_cut):
        super().__init__()
        self.l2_cut = l2_cut  # the ops bundle's cut + normalize (``Ops.l2_cut``)
        self.projector = projector
        self.normalize_default = normalize_default
        self.dimensions = dimensions  # the pooler config's default size (matryoshka)

    def forward(self, pooled: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        x = self.projector(pooled) if self.projector is not None else pooled  # (k, dim)
        dimensions = params.dimensions if params.dimensions is not None else self.dimensions
        normalize = self.normalize_default if params.use_activation is None else params.use_activation
        return self.l2_cut(x, dimensions, normalize)  # matryoshka: slice, then normalize


class RawHead(nn.Module):
    """The pooled rows through ``module`` (identity by default), nothing else: SPLADE weights and
    BGE-M3's sparse weights are neither sliced nor normalized."""

    def __init__(self, module: nn.Module | None = None):
        super().__init__()
        self.module = module or nn.Identity()

    def forward(self, pooled: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        return self.module(pooled)
