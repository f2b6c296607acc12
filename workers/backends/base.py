"""The contract every hardware backend fills: device, dtype choice, the ops bundle, set-up, transfers, report."""
from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch

from poolgate.workers.kernels.attention import AttentionFn, grouped_sdpa
from poolgate.workers.kernels.ops import Ops
from poolgate.workers.batch.packing import PackedBatch, to_device

log = logging.getLogger("poolgate.worker")


class Backend(ABC):
    """One hardware family. ``BACKENDS`` in ``workers.backends`` maps names to these."""

    name: str = ""
    default_batch_tokens: int = 16384  # token budget when --max-batch-tokens is not given
    # whether ``--dtype auto`` times the fast dtype against fp32 at load (``workers.load.auto_speed``): where the
    # same instructions run at very different speeds from one CPU to the next
    times_auto_dtype: bool = False

    @abstractmethod
    def available(self) -> bool:
        """Whether this process can run on the hardware."""

    @abstractmethod
    def device(self) -> torch.device:
        """The torch device the model runs on."""

    @abstractmethod
    def fast_dtype(self) -> torch.dtype:
        """The fastest dtype worth trying for ``--dtype auto`` (checked against fp32 at start)."""

    def setup(self, num_threads: int | None, cpu_affinity: tuple[int, ...] | None = None) -> None:
        """Process-wide set-up before the model loads (threads, allocator, flags); pins the
        process to ``cpu_affinity`` (the cores the gateway gave it, ``shared.config.backends``) when set."""
        if cpu_affinity:
            os.sched_setaffinity(0, cpu_affinity)
            log.info("pinned to CPUs %s", ",".join(map(str, cpu_affinity)))

    def attention(self, dtype: torch.dtype) -> AttentionFn:
        """The packed-attention implementation for ``dtype`` on this hardware."""
        return grouped_sdpa

    def uses_groups(self, dtype: torch.dtype) -> bool:
        """Whether packed batches need the grouped-SDPA plan (host-side work)."""
        return self.attention(dtype) is grouped_sdpa

    def token_bucket(self, n_tokens: int) -> int:
        """How many token rows a batch of ``n_tokens`` runs as (``packing.padded_rows``); ``n_tokens``: exactly."""
        return n_tokens

    def batch_tokens(self, model: torch.nn.Module, dtype: torch.dtype, hf_config: dict,
                     replicas: int = 1) -> tuple[int, str]:
        """The default token budget for ``model`` here when --max-batch-tokens is not given, and why:
        (tokens, one line for the log). A fixed number unless a backend knows its memory (``CudaBackend``)."""
        return self.default_batch_tokens, "the backend's default"

    def core_threads(self) -> int:
        """How many parts the runner cuts a batch into, run at once on single-threaded core threads
        (``workers.engine.core_threads``; CPUs); 1 = the whole batch on the device as one."""
        return 1

    def ops(self, dtype: torch.dtype) -> Ops:
        """The kernels a packed model is built with for ``dtype`` here (``workers.kernels.ops``):
        the torch references around this backend's attention, unless a backend says otherwise."""
        return Ops(attention=self.attention(dtype), plans_groups=self.uses_groups(dtype))

    def kernels(self, dtype: torch.dtype) -> dict[str, str]:
        """What each op of ``ops(dtype)`` runs here, and why not a faster one: op -> one line (reported in
        ``ModelInfo.kernels``, ``/v1/models`` and ``poolgate inspect``, logged at start)."""
        attention = self.attention(dtype)
        return {"attention": getattr(attention, "__name__", type(attention).__name__)}

    def optimize(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        """Last, hardware-specific changes once weights and dtype are final: the ops bundle's ``finalize``."""
        self.ops(dtype).finalize(model)

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

    def device_name(self) -> str:
        """The hardware's own name (e.g. the GPU model); empty where unknown."""
        return ""

    def memory_report(self) -> dict[str, int]:
        """Memory worth reporting once the model is loaded: ``memory()`` plus ``total`` where known."""
        return self.memory()

    def report(self, dtype: torch.dtype, device: str | None = None) -> dict:
        """What a worker says about where it runs (``ModelInfo``'s ``device``, ``device_name``,
        ``attention`` and ``device_memory``); ``device``: the host's number for it, when the gateway chose."""
        attention = self.attention(dtype)
        return {
            "device": f"{self.name}:{device}" if device is not None else str(self.device()),
            "device_name": self.device_name(),
            "attention": getattr(attention, "__name__", type(attention).__name__),
            "device_memory": self.memory_report(),
            "kernels": self.kernels(dtype),
        }

    def release_memory(self) -> None:
        """Give cached, unused device memory back (after a model is dropped; no-op on the CPU)."""

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""
