"""The ops bundle: the compute a packed model asks for (linear, norms, RoPE, attention), chosen by the backend.

A packed model never picks a kernel. It is built with one ``Ops`` from
``Backend.ops(dtype)`` and makes its layers with ``ops.linear``,
``ops.layer_norm`` and ``ops.rms_norm``, rotates q/k with ``ops.rope`` and
attends with ``ops.attention`` (the ``kernels.attention`` contract, soft-capping
included). Once the weights are loaded and cast, ``ops.finalize(model)`` makes
the backend's last changes (the CPU's bf16 linear prepacking).
``plans_groups`` says whether ``ops.attention`` reads the SDPA group plan,
which the runner then makes in ``prepare`` (host work, never in ``forward``).
The pooling ops (``pooling`` by method name, ``kept_mean``, ``kept_rows``,
``l2_cut``: ``workers.kernels.pooling``) are the poolers' and heads', which a
model's pooler gets with the bundle it was loaded with (``PoolerSources.ops``).
The defaults are the torch references every other kernel is tested against.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from poolgate.workers.kernels.attention import AttentionFn, grouped_sdpa
from poolgate.workers.kernels.linear import Linear
from poolgate.workers.kernels.norm import layer_norm, rms_norm
from poolgate.workers.kernels.pooling import (
    POOLING,
    KeptMean,
    KeptRows,
    L2Cut,
    PoolingMethod,
    kept_mean,
    kept_rows,
    l2_cut,
)
from poolgate.workers.kernels.rope import apply_rope


def _nothing(model: nn.Module) -> None:
    """The reference ``finalize``: the model runs as built."""


@dataclass(frozen=True)
class Ops:
    """One backend's kernels for one dtype (see the module docstring)."""

    attention: AttentionFn = grouped_sdpa
    linear: Callable[..., nn.Module] = Linear  # (in, out, bias=True, activation="none") → (n, in) → (n, out)
    layer_norm: Callable[..., nn.Module] = layer_norm  # (dim, eps, bias=True)
    rms_norm: Callable[..., nn.Module] = rms_norm  # (dim, eps, gemma=False)
    rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = apply_rope  # (x, cos, sin) → x
    finalize: Callable[[nn.Module], None] = _nothing
    plans_groups: bool = True
    pooling: Mapping[str, PoolingMethod] = field(default_factory=lambda: POOLING, hash=False)  # name → pooling method
    kept_mean: KeptMean = kept_mean  # (tokens, seq, index | None, n) → (n, hidden) fp32
    kept_rows: KeptRows = kept_rows  # (tokens, index | None) → (kept, hidden) fp32
    l2_cut: L2Cut = l2_cut  # (x, dimensions | None, normalize) → x cut, then L2-normalized

    @property
    def name(self) -> str:
        """The attention's name, as workers report it (``grouped_sdpa``, ``varlen_flash``)."""
        return getattr(self.attention, "__name__", type(self.attention).__name__)


REFERENCE = Ops()
