"""NVIDIA CUDA backend: fp16, varlen flash attention where torch has it."""
from __future__ import annotations

import torch

from poolgate.workers.backends.base import Backend
from poolgate.workers.kernels.attention import AttentionFn, grouped_sdpa, has_varlen, varlen_flash

HALF = (torch.float16, torch.bfloat16)


class CudaBackend(Backend):
    name = "cuda"
    default_batch_tokens = 32768

    def available(self) -> bool:
        return torch.cuda.is_available() and torch.version.hip is None

    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def fast_dtype(self) -> torch.dtype:
        return torch.float16

    def setup(self, num_threads: int | None) -> None:
        torch.backends.cuda.matmul.allow_tf32 = True
        if num_threads:
            torch.set_num_threads(num_threads)

    def attention(self, dtype: torch.dtype) -> AttentionFn:
        return varlen_flash if dtype in HALF and has_varlen() else grouped_sdpa

    def synchronize(self) -> None:
        torch.cuda.synchronize()


class RocmBackend(CudaBackend):
    """AMD ROCm: torch exposes it through the cuda device type."""

    name = "rocm"

    def available(self) -> bool:
        return torch.cuda.is_available() and torch.version.hip is not None
