"""What ``poolgate bench-runner`` reports beside tokens/s: the GEMM peak it reaches and attention's share.

``gemm_peak`` times square-ish bf16 (and int8) matmuls as the runner runs them:
on each CPU core thread at once (one thread each, ``workers.engine.core_threads``), or on the
device; its GFLOP/s is what this machine's GEMM library gives, the ceiling
for a runner whose time is its linears. ``linear_flops`` counts a model's
linear-layer FLOPs per token (2 x in x out for every ``Linear`` and
``PackedLinear``). ``attention_share`` runs batches through the model on one
thread with every ``attention`` its layers hold timed, and gives that time
over the whole forward (on a GPU: the device is synchronized around each call).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

from poolgate.workers.engine.core_threads import CoreThreads

GEMM = (4096, 1024, 1024)  # rows x in x out: a packed batch through a hidden-1024 layer


def _rate(fn: Callable[[], object], flops: float, sync: Callable[[], None], seconds: float = 0.5) -> float:
    for _ in range(3):
        fn()
    sync()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    sync()
    return flops * n / (time.perf_counter() - start)


def gemm_peak(device: torch.device, dtype: torch.dtype, core_threads: int, sync: Callable[[], None]) -> dict:
    """GFLOP/s of a linear in ``dtype`` (and of int8 ``torch._int_mm`` where this torch has it), summed over
    the core threads."""
    m, k, n = GEMM
    out = {"shape": list(GEMM), "dtype": str(dtype).removeprefix("torch.")}
    for name, make in (("float", lambda: (torch.randn(m, k, device=device).to(dtype),
                                          torch.randn(n, k, device=device).to(dtype))),
                       ("int8", lambda: (torch.randint(-64, 64, (m, k), dtype=torch.int8, device=device),
                                         torch.randint(-64, 64, (k, n), dtype=torch.int8, device=device)))):
        def one(_: int) -> float:
            x, w = make()
            op = (lambda: torch.nn.functional.linear(x, w)) if name == "float" else (lambda: torch._int_mm(x, w))
            with torch.inference_mode():
                return _rate(op, 2.0 * m * k * n, sync)

        try:
            rates = CoreThreads(core_threads).map(one, range(core_threads)) if core_threads > 1 else [one(0)]
        except (RuntimeError, NotImplementedError) as exc:  # no int8 matmul in this build / on this device
            out[f"{name}_gflops"] = None
            out[f"{name}_error"] = str(exc).splitlines()[0][:200]
            continue
        out[f"{name}_gflops"] = round(sum(rates) / 1e9, 1)
    return out


def linear_flops(model: nn.Module) -> int:
    """FLOPs per token of every linear layer in ``model`` (2 x in x out each)."""
    total = 0
    for m in model.modules():
        if isinstance(m, nn.Linear):
            total += 2 * m.in_features * m.out_features
        elif hasattr(m, "packed") and hasattr(m, "out_features"):  # kernels.linear.PackedLinear
            total += 2 * m.in_features * m.out_features
    return total


def attention_share(model: nn.Module, inputs: list, sync: Callable[[], None]) -> float | None:
    """Attention's time over the forward's, on one thread over ``inputs`` (packed batches); None when the
    model holds no ``attention`` function to time."""
    timed: list[tuple[nn.Module, Callable]] = []
    spent = [0.0]
    for m in model.modules():
        fn = m.__dict__.get("attention")
        if callable(fn) and not isinstance(fn, nn.Module):
            def wrapped(*a, _fn=fn, **kw):
                sync()
                start = time.perf_counter()
                result = _fn(*a, **kw)
                sync()
                spent[0] += time.perf_counter() - start
                return result
            timed.append((m, fn))
            m.attention = wrapped
    if not timed:
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            model(inputs[0])  # warm: kernels built, primitives made
            spent[0] = 0.0
            sync()
            start = time.perf_counter()
            for batch in inputs:
                model(batch)
            sync()
            total = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
        for m, fn in timed:
            m.attention = fn
    return spent[0] / total if total > 0 else None
