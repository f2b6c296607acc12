"""Embedding heads: sentence-transformers Dense projection → matryoshka slice → L2 normalize; raw rows."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from poolgate.shared.params import PoolingParams
from poolgate.workers.load.checkpoint import Checkpoint
from poolgate.workers.load.st_config import DenseSpec
from poolgate.workers.pooling.classify import torch_activation


def load_dense(spec: DenseSpec, *, allow_pickle: bool) -> nn.Module:
    """One Dense module as Linear + activation, from its folder's weights."""
    linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
    weights = Checkpoint.open(spec.path, allow_pickle=allow_pickle)
    linear.load_state_dict({k.removeprefix("linear."): weights[k].float() for k in weights})
    weights.close()
    return nn.Sequential(linear, torch_activation(spec.activation, "Dense activation"))


class EmbedHead(nn.Module):
    """(k, hidden) fp32 pooled states of sequences that share params → (k, dim) vectors."""

    def __init__(self, projector: nn.Module | None, normalize_default: bool, dimensions: int | None = None):
        super().__init__()
        self.projector = projector
        self.normalize_default = normalize_default
        self.dimensions = dimensions  # the pooler config's default size (matryoshka)

    def forward(self, pooled: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        x = self.projector(pooled) if self.projector is not None else pooled  # (k, dim)
        dimensions = params.dimensions if params.dimensions is not None else self.dimensions
        if dimensions is not None:
            x = x[:, :dimensions]  # matryoshka: slice, then normalize
        normalize = self.normalize_default if params.use_activation is None else params.use_activation
        return F.normalize(x, p=2, dim=-1) if normalize else x


class RawHead(nn.Module):
    """The pooled rows through ``module`` (identity by default), nothing else: SPLADE weights and
    BGE-M3's sparse weights are neither sliced nor normalized."""

    def __init__(self, module: nn.Module | None = None):
        super().__init__()
        self.module = module or nn.Identity()

    def forward(self, pooled: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        return self.module(pooled)
