"""GELU in place on fp32 for x86 CPUs with AVX2 and FMA: the exact (erf) and tanh forms, after the fp32 linears.

``gelu_f32.c`` (beside this file) is built like the fp32 attention
(``kernels.cbuild``, ``-mavx2 -mfma`` alone, cached) and registered as the
``torch.library`` op ``poolgate::gelu_f32_``. ``DnnLinear``
(``kernels.linear_fp32``) runs it on its matmul's fresh output for the tanh
GELU (``gelu_new``, ``gelu_pytorch_tanh``: ``KERNEL_ACTIVATIONS``) where
``unavailable`` says None, torch's ``gelu_`` elsewhere. The exact (erf) form
is within 2e-6 of ``F.gelu`` over [-10, 10] (tested, as the tanh form) but
measured slower than torch's AVX2 erf GELU, so the bundled MiniLM's ``gelu``
stays torch's (figures in docs/operations.md "CPU kernels"). A team of threads splits a
large tensor (``SPLIT_ELEMENTS`` a thread); one torch thread (the CPU
backend's core threads) runs it whole. ``POOLGATE_CPU_GELU=torch`` keeps
torch's GELU for an A/B; ``POOLGATE_CPU_KERNELS=off`` never builds a
``DnnLinear`` at all.
"""
from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

import torch

from poolgate.shared.config.cpu import cpu_flags
from poolgate.workers.kernels import cbuild, custom_ops

SOURCE = Path(__file__).with_name("gelu_f32.c")
MODE_ENV = "POOLGATE_CPU_GELU"  # "torch": torch's GELU even where the kernel runs
SPLIT_ELEMENTS = 1 << 18  # a team of threads splits a tensor only from this many elements a thread
# gelu_f32.c's exported function, as cbuild.bind types it
SIGNATURES: dict[str, cbuild.Signature] = {
    "poolgate_gelu_f32": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)),
}
# the activations ``DnnLinear`` runs the kernel for: the tanh form only, 3-4x torch's (AVX2, one thread); the erf
# form measured 2.3x slower than torch's own AVX2 erf GELU, and level in the bundled MiniLM's runner (its "gelu")
KERNEL_ACTIVATIONS = frozenset({"gelu_new", "gelu_pytorch_tanh"})


@cache
def loaded():
    """(entry point, None) or (None, why): a failed build is remembered, never tried again on every call."""
    try:
        lib = cbuild.load(SOURCE, (), "", cbuild.AVX2_CFLAGS)
    except (OSError, RuntimeError) as exc:
        return None, str(exc)
    return cbuild.bind(lib, "poolgate_gelu_f32", SIGNATURES), None


@cache
def unavailable() -> str | None:
    """Why the kernel cannot run on this machine, or None when it can (checked once: flags, compiler, a build)."""
    if os.environ.get(MODE_ENV, "auto").lower() == "torch":
        return f"{MODE_ENV}=torch"
    missing = cbuild.AVX2_FLAGS - cpu_flags()
    if missing:
        return f"the CPU lacks {', '.join(sorted(missing))}"
    reason = loaded()[1]
    return None if reason is None else f"the GELU kernel did not build: {reason}"


def _takes(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.is_cpu and x.is_contiguous()


def _gelu(x: torch.Tensor, tanh: bool, bounds: list[int]) -> None:
    """``poolgate::gelu_f32_``: GELU (the tanh form if ``tanh``) in place on a contiguous fp32 CPU tensor,
    element ranges ``bounds`` (starts multiples of 8) on threads of their own. Trusts its eager caller
    (``gelu_``); under tracing the fake checks the same."""
    fn, reason = loaded()
    if fn is None:
        raise RuntimeError(reason)
    cbuild.run_split(fn, (x.data_ptr(), int(tanh)), list(zip(bounds[:-1], bounds[1:], strict=True)))


def _gelu_fake(x, tanh, bounds) -> None:
    if not _takes(x):
        raise ValueError("poolgate::gelu_f32_ takes a contiguous fp32 CPU tensor")


GELU = custom_ops.define("gelu_f32_(Tensor(a!) x, bool tanh, int[] bounds) -> ()", _gelu, _gelu_fake)


def bounds(n: int, threads: int) -> list[int]:
    """Element ranges for ``threads`` threads over ``n`` elements (one range below ``SPLIT_ELEMENTS`` a thread),
    each start a multiple of 8."""
    parts = max(1, min(threads, n // SPLIT_ELEMENTS))
    step = (-(-n // parts) + 7) // 8 * 8
    return [min(i * step, n) for i in range(parts)] + [n]


def gelu_(x: torch.Tensor, tanh: bool = False) -> torch.Tensor:
    """GELU in place (exact, or the tanh form), ``x`` back: the kernel for a contiguous fp32 CPU tensor,
    torch's ``gelu_`` for anything else. The caller checks ``unavailable`` once."""
    if not _takes(x):
        return torch.ops.aten.gelu_(x, approximate="tanh" if tanh else "none")
    n = x.numel()
    if n:
        GELU(x, tanh, bounds(n, torch.get_num_threads()))
    return x
