"""The contract every hardware backend fills: device, dtype choice, attention, set-up, transfers."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch

from poolgate.workers.kernels.attention import AttentionFn, grouped_sdpa
from poolgate.workers.packing import PackedBatch, to_device


class Backend(ABC):
    """One hardware family. ``BACKENDS`` in ``workers.backends`` maps names to these."""

    name: str = ""
    default_batch_tokens: int = 16384  # token budget when --max-batch-tokens is not given

    @abstractmethod
    def available(self) -> bool:
        """Whether this process can run on the hardware."""

    @abstractmethod
    def device(self) -> torch.device:
        """The torch device the model runs on."""

    @abstractmethod
    def fast_dtype(self) -> torch.dtype:
        """The fastest dtype worth trying for ``--dtype auto`` (checked against fp32 at start)."""

    def setup(self, num_threads: int | None) -> None:
        """Process-wide set-up before the model loads (threads, allocator, flags)."""

    def attention(self, dtype: torch.dtype) -> AttentionFn:
        """The packed-attention implementation for ``dtype`` on this hardware."""
        return grouped_sdpa

    def uses_groups(self, dtype: torch.dtype) -> bool:
        """Whether packed batches need the grouped-SDPA plan (host-side work)."""
        return self.attention(dtype) is grouped_sdpa

    def optimize(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        """Last, hardware-specific changes once weights and dtype are final (e.g. prepacking)."""

    def upload(self, batch: PackedBatch) -> tuple[PackedBatch, Any]:
        """Start moving a packed batch to the device (prepare thread); returns it and a ready marker."""
        return to_device(batch, self.device()), None

    def wait_upload(self, ready: Any, batch: PackedBatch) -> None:
        """Make the compute stream wait for ``upload`` to finish (execute thread)."""

    def to_host(self, tensors: list[torch.Tensor]) -> list[np.ndarray]:
        """Results to numpy, all copies issued before one wait (free on the CPU)."""
        return [t.cpu().numpy() for t in tensors]

    def memory(self) -> dict[str, int]:
        """Device memory in bytes by kind (``allocated``, ``reserved``); empty where not reported."""
        return {}

    def release_memory(self) -> None:
        """Give cached, unused device memory back (after a model is dropped; no-op on the CPU)."""

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""
