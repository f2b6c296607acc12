"""Intel XPU backend (``torch.xpu``): bf16, grouped SDPA attention, Triton norms, linear epilogues and RoPE
(``kernels.gpu``; torch's XPU build brings pytorch-triton-xpu); the gateway picks the device with ZE_AFFINITY_MASK."""
from __future__ import annotations

import torch

from poolgate.workers.backends.base import Backend
from poolgate.workers.kernels.gpu.ops import gpu_kernels, gpu_ops
from poolgate.workers.kernels.ops import Ops


class XpuBackend(Backend):
    name = "xpu"

    def available(self) -> bool:
        return hasattr(torch, "xpu") and torch.xpu.is_available()

    def device(self) -> torch.device:
        return torch.device("xpu", torch.xpu.current_device())

    def fast_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def ops(self, dtype: torch.dtype) -> Ops:
        return gpu_ops(super().ops(dtype), dtype)

    def kernels(self, dtype: torch.dtype) -> dict[str, str]:
        return gpu_kernels(self.attention(dtype), dtype)

    def memory(self) -> dict[str, int]:
        device = self.device()
        return {"allocated": torch.xpu.memory_allocated(device), "reserved": torch.xpu.memory_reserved(device)}

    def device_name(self) -> str:
        return torch.xpu.get_device_name(self.device())

    def memory_report(self) -> dict[str, int]:
        return {**self.memory(), "total": torch.xpu.get_device_properties(self.device()).total_memory}

    def release_memory(self) -> None:
        torch.xpu.empty_cache()

    def synchronize(self) -> None:
        torch.xpu.synchronize()
