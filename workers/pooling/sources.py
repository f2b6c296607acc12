"""What a model's pooler factories read: its spec, the load's one checkpoint handle, its tokenizer, the device."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from poolgate.workers.kernels.ops import REFERENCE, Ops
from poolgate.workers.load.checkpoint import Tensors
from poolgate.workers.load.st_config import ModelSpec


@dataclass(frozen=True)
class PoolerSources:
    """``weights`` is the checkpoint the model was loaded from, its base-model prefix (``bert.``, ``model.``)
    dropped, so heads find ``classifier.weight`` and ``embeddings.word_embeddings.weight`` alike; tensors are
    read only when a head asks for them. ``tokenizer`` is the worker's own (transformers; None where no head
    needs one, as for ``bench-arch``'s embedders)."""

    spec: ModelSpec
    weights: Tensors
    tokenizer: Any
    device: torch.device
    allow_pickle: bool = False
    ops: Ops = REFERENCE  # the backend's bundle: the poolers' pooling ops and the heads' L2 normalize

    def the_tokenizer(self, what: str) -> Any:
        """The tokenizer, for a head that needs token ids (``what`` names it in the error)."""
        if self.tokenizer is None:
            raise ValueError(f"{what} needs the model's tokenizer, and none was given")
        return self.tokenizer
