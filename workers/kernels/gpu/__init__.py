"""GPU kernels written in Triton: one source for NVIDIA (CUDA), AMD (ROCm) and Intel (XPU) GPUs.

Each kernel has a torch reference (the ops bundle's default, ``workers.kernels.ops``) and is tested against it
under Triton's interpreter (``TRITON_INTERPRET=1`` runs a kernel on CPU tensors), so CI keeps them from rotting
on machines without a GPU. The GPU backends put them into their ops bundle (``Backend.ops(dtype)``) when
``unavailable()`` is None; model code never names a kernel.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from functools import cache

INTERPRET_ENV = "TRITON_INTERPRET"
OFF_ENV = "POOLGATE_TRITON"  # "off": the GPU backends run the torch references


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (on CPU tensors) in this process."""
    return os.environ.get(INTERPRET_ENV, "0") not in ("", "0")


@cache
def unavailable() -> str | None:
    """Why the Triton kernels cannot run in this process, or None."""
    if os.environ.get(OFF_ENV, "auto").lower() == "off":
        return f"{OFF_ENV}=off"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'poolgate[gpu]')"
    if not interpreting() and not any(shutil.which(c) for c in (os.environ.get("CC") or "", "cc", "gcc", "clang") if c):
        return "no C compiler for Triton's kernel launcher (install gcc, or set CC)"
    return None
