"""Packed attention in fp32 on x86 CPUs with AVX2 and FMA: the C kernel beside the bf16 one, for fp32 models.

``packed_attention_f32.c`` (beside this file) is built like the bf16 kernel
(``kernels.cbuild``, one shared object per head dimension, cached), but with
``-mavx2 -mfma`` alone, so it runs on every CPU of the ``avx2`` class and
above (AMD Zen 2/3, Haswell). It is the ``torch.library`` op
``poolgate::packed_attention_f32``, called by
``cpu_attention.packed_cpu_attention`` for fp32 q/k/v: it reads q, k and v
where the QKV projection left them (no gather, no padding, no group plan),
one (sequence, head) at a time, an exact two-pass fp32 softmax between the two
products. What it takes: fp32, a head dim that is a multiple of 8 (at most
256), causal or not, windows, grouped-query heads, any length. Measured
figures are in docs/operations.md "CPU kernels".
"""
from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

import torch

from poolgate.shared.config.cpu import cpu_flags
from poolgate.workers.kernels import cbuild, custom_ops

SOURCE = Path(__file__).with_name("packed_attention_f32.c")
MODE_ENV = "POOLGATE_CPU_ATTENTION"  # "sdpa": grouped SDPA even where the kernel runs (cpu_attention's switch)
# packed_attention_f32.c's exported function, as cbuild.bind types it
SIGNATURES: dict[str, cbuild.Signature] = {
    "poolgate_attend_f32": (ctypes.c_int, (ctypes.c_void_p,) * 3 + (ctypes.c_int64,) * 3 + (
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p) + (ctypes.c_int64,) * 3 + (ctypes.c_float, ctypes.c_int)
        + (ctypes.c_int64,) * 5),
}
HEAD_DIMS = tuple(range(8, 257, 8))  # every head dim the kernel takes


def supported_head_dim(head_dim: int) -> bool:
    return head_dim % 8 == 0 and 8 <= head_dim <= 256


def variant(head_dim: int) -> tuple[Path, tuple[str, ...], str, tuple[str, ...]]:
    """``cbuild.build``'s arguments for the build of ``head_dim``."""
    return SOURCE, (f"-DHD={head_dim}",), f"_hd{head_dim}", cbuild.AVX2_CFLAGS


@cache
def loaded(head_dim: int):
    """(entry point, None) or (None, why): a failed build is remembered, never tried again on every call."""
    try:
        lib = cbuild.load(*variant(head_dim))
    except (OSError, RuntimeError) as exc:
        return None, str(exc)
    return cbuild.bind(lib, "poolgate_attend_f32", SIGNATURES), None


@cache
def unavailable() -> str | None:
    """Why the kernel cannot run on this machine, or None when it can (checked once: flags, compiler, a build)."""
    if os.environ.get(MODE_ENV, "auto").lower() == "sdpa":
        return f"{MODE_ENV}=sdpa"
    missing = cbuild.AVX2_FLAGS - cpu_flags()
    if missing:
        return f"the CPU lacks {', '.join(sorted(missing))}"
    reason = loaded(32)[1]
    return None if reason is None else f"the fp32 kernel did not build: {reason}"


def prepare(head_dim: int) -> str | None:
    """Build and load the kernel for ``head_dim`` now (at model load): why it cannot run it, or None."""
    if not supported_head_dim(head_dim):
        return f"the fp32 kernel takes head dims of 8 to 256 in steps of 8, not {head_dim}"
    reason = loaded(head_dim)[1]
    return None if reason is None else f"no fp32 build for head dim {head_dim}: {reason}"


def takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel reads q, k and v as they are: fp32 on the CPU, heads and dims packed in each token's
    row (any token stride), one head dim it is built for."""
    head_dim = q.shape[2]
    return (q.dtype == k.dtype == v.dtype == torch.float32 and q.is_cpu and k.is_cpu and v.is_cpu
            and q.stride()[1:] == k.stride()[1:] == v.stride()[1:] == (head_dim, 1)
            and k.shape[2] == v.shape[2] == head_dim and q.shape[1] % k.shape[1] == 0 and supported_head_dim(head_dim))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float, causal: bool,
            left: int, right: int, max_len: int, bounds: list[int]) -> torch.Tensor:
    """``poolgate::packed_attention_f32`` on CPU tensors: as ``poolgate::packed_attention`` (the same arguments,
    rows of sequences over ``max_len`` and past the last sequence unwritten), in fp32. It trusts its eager
    caller (``packed_cpu_attention`` checks with ``takes``); under tracing the fake checks the same."""
    n, heads, head_dim = q.shape
    fn, reason = loaded(head_dim)
    if fn is None:
        raise RuntimeError(reason)
    out = q.new_empty(n, heads, head_dim)  # (n_tokens, heads, head_dim)
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0), k.stride(0), v.stride(0), out.data_ptr(),
            out.stride(0), cu_seqlens.data_ptr(), cu_seqlens.shape[0] - 1, heads, k.shape[1], scale, int(causal),
            left, right, max_len)
    if any(cbuild.run_split(fn, args, list(zip(bounds[:-1], bounds[1:], strict=True)))):
        raise MemoryError("packed fp32 CPU attention could not allocate its scratch memory")
    return out


def _attend_fake(q, k, v, cu_seqlens, scale, causal, left, right, max_len, bounds):
    """The output's shape under tracing, once the inputs are what the kernel takes (ValueError else)."""
    if not (takes(q, k, v) and cu_seqlens.dtype == torch.int32 and cu_seqlens.is_contiguous()):
        raise ValueError("poolgate::packed_attention_f32 takes fp32 q/k/v of packed heads and int32 cu_seqlens")
    return q.new_empty(q.shape[0], q.shape[1], v.shape[-1])


ATTEND = custom_ops.define("packed_attention_f32(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float scale, "
                           "bool causal, int left, int right, int max_len, int[] bounds) -> Tensor",
                           _attend, _attend_fake)
