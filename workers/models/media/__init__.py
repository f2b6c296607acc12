"""Media models: images and audio in, through transformers' own model (padded), pooled by the usual poolers.

A media family (``MediaFamily``; one module here each, one line in
``workers.models.media.families.MEDIA_ARCHITECTURES``) builds, from a model
folder (``MediaSource``), what ``workers.load.media_build`` serves
(``MediaBuilt``): the model, its poolers, its tokenizer files with the
``media`` settings the gateway's plan reads (``shared.inputs.media``), and the
modalities it takes.

A media model is an ``nn.Module`` with ``takes_media = True`` and
``packed_rows = False`` whose ``forward(batch)`` reads the packed batch's ids
and ``batch.media`` (per sequence its ``shared.wire.media.MediaItem``s, numpy
on the host: the model moves what it reads to its device) and returns
``(n_tokens, dim)`` rows in packed order, as every model does; a family puts
its sequence vector where its pooler reads it (the sequence's LAST row for a
dual encoder's projected embedding or a classifier's logits) and, for token
tasks, one row per token (ColPali's page patches). It loads its checkpoint
whole or refuses, as ``workers.models.hf_auto`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.workers.kernels.ops import Ops
from poolgate.workers.pooling.dispatch import DispatchPooler


@dataclass(frozen=True)
class MediaSource:
    """What a family builds from: the folder, its config, the dtype and device, the worker's settings."""

    path: Path
    hf_config: dict[str, Any]
    architecture: str
    dtype: torch.dtype
    device: torch.device
    ops: Ops
    settings: Any  # the WorkerConfig (pooler_config, kind via --runner/--convert, allow_partial_weights, ...)


@dataclass
class MediaBuilt:
    """A built media model (module doc)."""

    model: nn.Module
    pooler: DispatchPooler
    files: TokenizerFiles  # with ``media`` set: {"plan": name, ...} (shared.inputs.media)
    modalities: tuple[str, ...]  # text, image, audio: what its inputs may hold
    embedding_dim: int
    max_model_len: int  # the longest sequence (text tokens plus media placeholders) it reads
    labels: tuple[str, ...] | None = None  # a classifier's
    warm_up: Callable[[Any], None] | None = None  # runs a synthetic batch through the runner once
    extra: dict[str, Any] = field(default_factory=dict)  # for `poolgate inspect`: what the family reports


@dataclass(frozen=True)
class MediaFamily:
    """One media family: its name, what it builds and how ``poolgate inspect`` names its path."""

    name: str
    build: Callable[[MediaSource], MediaBuilt]
    implementation: str  # e.g. "transformers CLIPModel (padded), towers by input"
    tasks: tuple[str, ...] = ()  # what it serves, for `poolgate inspect` before loading (empty: settled at load)
    modalities: tuple[str, ...] = ()  # likewise: what its inputs may hold
    attention: str | None = None  # for `poolgate inspect`, where it is not transformers' own over a padded batch
