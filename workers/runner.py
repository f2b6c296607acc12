"""The pooling runner: packed batch → model forward → pooler → arrays on the host."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from poolgate.shared.wire import ModelInfo
from poolgate.workers.backends.base import Backend
from poolgate.workers.packing import pack, to_device
from poolgate.workers.pooling.head import EmbedHead
from poolgate.workers.pooling.methods import PoolingMethod
from poolgate.workers.sequence import Sequence
from poolgate.workers.tokenizer import TextEncoder


class PoolingRunner:
    """Runs one model for the engine: ``encode_texts`` and ``run`` (the Runner contract)."""

    def __init__(self, *, model: nn.Module, encoder: TextEncoder, backend: Backend, dtype: torch.dtype,
                 method: PoolingMethod, head: EmbedHead, info: ModelInfo):
        self.model, self.encoder, self.backend, self.dtype = model, encoder, backend, dtype
        self.method, self.head, self.info = method, head, info
        self.device = backend.device()
        self.position_offset = getattr(getattr(model, "config", None), "position_offset", 0)
        self.group_attention = backend.uses_groups(dtype)
        self.max_batch_tokens = backend.default_batch_tokens

    def encode_texts(self, texts: list[str], max_tokens: int | None = None) -> list[list[int]]:
        return self.encoder.encode(texts, max_tokens)

    @torch.inference_mode()
    def pooled(self, token_ids: list[list[int]]) -> torch.Tensor:
        """(batch, hidden) fp32 pooled states before the head."""
        batch = pack(token_ids, position_offset=self.position_offset, group_attention=self.group_attention)
        batch = to_device(batch, self.device)
        hidden = self.model(batch).float()  # (n_tokens, hidden), pooling in fp32
        return self.method(hidden, batch)

    @torch.inference_mode()
    def run(self, batch: list[Sequence]) -> list[np.ndarray]:
        pooled = self.pooled([s.token_ids for s in batch])  # (batch, hidden)
        vectors = self.head(pooled, [s.params for s in batch])
        if len({v.shape for v in vectors}) == 1:
            return list(torch.stack(vectors).cpu().numpy())
        return [v.cpu().numpy() for v in vectors]
