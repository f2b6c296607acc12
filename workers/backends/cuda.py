"""NVIDIA CUDA backend: fp16, varlen flash attention where torch has it, Triton norms, linear epilogues and
RoPE (``kernels.gpu``), uploads on a copy stream.

A batch is laid into a reused pinned buffer and copied to the GPU in one copy
on a side stream in the engine's prepare thread (``workers.backends.staging``),
so the copy of batch N+1 overlaps the forward of batch N; the compute stream
waits on the copy's event before it reads the batch.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from poolgate.workers.backends.base import Backend
from poolgate.workers.backends.budget import token_budget
from poolgate.workers.kernels.attention import AttentionFn, grouped_sdpa, has_varlen, varlen_flash
from poolgate.workers.backends.staging import Staging, read_back, upload
from poolgate.workers.kernels.gpu.ops import gpu_kernels, gpu_ops
from poolgate.workers.kernels.ops import Ops
from poolgate.workers.batch.packing import PackedBatch, tensors

HALF = (torch.float16, torch.bfloat16)


class CudaBackend(Backend):
    name = "cuda"
    default_batch_tokens = 32768

    def __init__(self) -> None:
        self._copy_stream: torch.cuda.Stream | None = None
        self._staging = Staging(pin=True)  # reused pinned host buffers (workers.backends.staging)

    def available(self) -> bool:
        return torch.cuda.is_available() and torch.version.hip is None

    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def fast_dtype(self) -> torch.dtype:
        return torch.float16

    def setup(self, num_threads: int | None, cpu_affinity: tuple[int, ...] | None = None) -> None:
        super().setup(num_threads, cpu_affinity)
        torch.backends.cuda.matmul.allow_tf32 = True
        if num_threads:
            torch.set_num_threads(num_threads)

    def attention(self, dtype: torch.dtype) -> AttentionFn:
        """Varlen flash attention for fp16/bf16 where torch ships it and the GPU runs it (Ampere, SM 8.0,
        or newer: torch's flash kernel refuses T4 and V100); causal, windows and GQA are in the kernel and
        a relative bias falls back to grouped SDPA inside it. Else grouped SDPA."""
        flash = dtype in HALF and has_varlen() and torch.cuda.get_device_capability(self.device())[0] >= 8
        return varlen_flash if flash else grouped_sdpa

    def ops(self, dtype: torch.dtype) -> Ops:
        """The library's attention (``attention``), the norms, linear epilogues and RoPE in Triton where it
        runs (``kernels.gpu.ops``; ROCm too)."""
        return gpu_ops(super().ops(dtype), dtype)

    def kernels(self, dtype: torch.dtype) -> dict[str, str]:
        return gpu_kernels(self.attention(dtype), dtype)

    def upload(self, batch: PackedBatch) -> tuple[PackedBatch, Any]:
        """The batch's tensors into a reused pinned buffer, then one copy on the copy stream
        (``workers.backends.staging``); the buffer goes back to the pool once the copy's event fires."""
        device = self.device()
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device)
        ready = torch.cuda.Event()

        def move(flat: torch.Tensor) -> torch.Tensor:
            with torch.cuda.stream(self._copy_stream):
                on_device = flat.to(device, non_blocking=True)
                ready.record(self._copy_stream)
            return on_device

        on_device, buf = upload(batch, self._staging, move)
        self._staging.give(buf, ready.query)  # reused once the copy has read it
        return on_device, (ready, buf)

    def wait_upload(self, ready: Any, batch: PackedBatch) -> None:
        stream = torch.cuda.current_stream()
        stream.wait_event(ready[0])
        for t in tensors(batch):
            t.record_stream(stream)  # allocated on the copy stream, read on this one

    def to_host(self, outputs: list[torch.Tensor]) -> list[np.ndarray]:
        """One copy of every result's bytes into a reused pinned buffer, one wait, then numpy copies."""
        stream = torch.cuda.current_stream()
        return read_back(outputs, self._staging, lambda dst, src: dst.copy_(src, non_blocking=True),
                         stream.synchronize)

    def memory(self) -> dict[str, int]:
        device = self.device()
        return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device)}

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device())

    def memory_report(self) -> dict[str, int]:
        return {**self.memory(), "total": torch.cuda.get_device_properties(self.device()).total_memory}

    def release_memory(self) -> None:
        torch.cuda.empty_cache()

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    # -- the token budget from the GPU's memory (workers.backends.budget) --
    def batch_tokens(self, model: torch.nn.Module, dtype: torch.dtype, hf_config: dict,
                     replicas: int = 1) -> tuple[int, str]:
        hidden = int(hf_config.get("hidden_size") or getattr(model, "hidden_size", 0) or 0)
        if hidden < 1:
            return self.default_batch_tokens, "the backend's default (the model names no hidden_size)"
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        budget = token_budget(total_bytes=torch.cuda.get_device_properties(self.device()).total_memory,
                              weight_bytes=weights, hidden=hidden,
                              intermediate=int(hf_config.get("intermediate_size") or 4 * hidden),
                              dtype_bytes=torch.tensor([], dtype=dtype).element_size(), replicas=replicas)
        return budget.tokens, f"{budget.line()}, {replicas} worker(s) on the device"


class RocmBackend(CudaBackend):
    """AMD ROCm: torch exposes it through the cuda device type; a ROCm build of torch sets ``torch.version.hip``."""

    name = "rocm"

    def attention(self, dtype: torch.dtype) -> AttentionFn:
        """SDPA per length group (torch's varlen flash kernel is built for NVIDIA GPUs)."""
        return grouped_sdpa

    def available(self) -> bool:
        return torch.cuda.is_available() and torch.version.hip is not None
