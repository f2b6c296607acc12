"""CPU backend: bf16 where the CPU has AMX or AVX512-BF16, fp32 elsewhere; threads per (pinned) worker.

What runs for each dtype is decided here, once, from the CPU's flags as
``shared.config.cpu`` shows them (``POOLGATE_CPU_CLASS`` can show a smaller CPU),
never by catching a kernel's error: ``--dtype auto`` tries bf16 only where the
CPU has bf16 instructions; the C kernels need AVX512-BF16 (the fp32 packed
attention: AVX2 and FMA); oneDNN's prepacked
bf16 linears need oneDNN's bf16 path (AVX512BW/VL/DQ or AVX-NE-CONVERT).
An explicit dtype the CPU has no instructions for still runs, correctly, on
torch's own kernels, and the worker says once at start how much slower that
is (``SLOW_DTYPES``; the factors, measured per class, in docs/operations.md).
The C kernels are built (or found in the kernel cache) at model load, never
in a request: the CPU check builds one of each when the ops are picked, and
``optimize`` the attention for each head dim the model attends with, so the
start-up table (``kernels``) says what runs, and why not, before the warm-up.
"""
from __future__ import annotations

import logging
import os
import resource
from dataclasses import replace
from functools import cache

import torch

from poolgate.shared.config.backends import available_cpus, physical_cores
from poolgate.shared.config.cpu import BF16_INSTRUCTIONS, cpu_class, cpu_flags, cpu_model, dtype_path
from poolgate.workers.backends.base import Backend
from poolgate.workers.kernels import cpu_attention, cpu_attention_f32, fused_norm, gelu_f32
from poolgate.workers.kernels.attention import AttentionFn, grouped_sdpa
from poolgate.workers.kernels.linear import packed_linear_available, prepack_linears
from poolgate.workers.kernels.linear_fp32 import dnn_linear_available, dnn_linears
from poolgate.workers.kernels.norm import add_in_place_layer_norm
from poolgate.workers.kernels.ops import Ops

log = logging.getLogger("poolgate.worker")

KERNELS_ENV = "POOLGATE_CPU_KERNELS"  # "off": torch's reference paths for every op (ARM64 and no-compiler CPUs' path)

BF16_FLAGS = BF16_INSTRUCTIONS  # where ``--dtype auto`` tries bf16 (x86 only: ARM64 bf16 is unmeasured)
# (dtype, shared.config.cpu.dtype_path) -> what the worker logs once at start; the factors per class, measured with
# ``poolgate bench-runner``, are in docs/operations.md "CPU classes".
SLOW_DTYPES: dict[tuple[str, str], str] = {
    ("bfloat16", "fallback"): "no bf16 instructions and no oneDNN bf16 path: torch's reference kernels run it, "
                              "correct but about 9x slower than float32",
    ("bfloat16", "onednn"): "no bf16 instructions: oneDNN converts bf16 to float32 in registers, correct but "
                            "about 3x slower than float32 (for half the memory)",
    ("float16", "fallback"): "no fp16 instructions (AVX512-FP16, AMX-FP16): torch's reference kernels run it, "
                             "correct but about 9x slower than float32",
}


class CpuBackend(Backend):
    name = "cpu"
    default_batch_tokens = 8192  # measured: 4–8k-token batches stay cache-friendly on CPUs
    times_auto_dtype = True  # AVX512-BF16 runs bf16 well on AMD Zen 4, slower than fp32 on an Intel Xeon

    def available(self) -> bool:
        return True

    def device(self) -> torch.device:
        return torch.device("cpu")

    def fast_dtype(self) -> torch.dtype:
        """bf16 where the CPU has its instructions (AVX512-BF16, AMX); fp32 elsewhere (``shared.config.cpu``)."""
        return torch.bfloat16 if cpu_flags() & BF16_FLAGS else torch.float32

    def __init__(self) -> None:
        self._core_threads = 1
        # head dim -> why the packed attention cannot run it (None: it runs), for the model ``optimize`` saw
        self._head_dims: dict[int, str | None] | None = None

    def setup(self, num_threads: int | None, cpu_affinity: tuple[int, ...] | None = None) -> None:
        """Pin first (so the default is the physical cores of this worker's share). By default each core is a
        core thread (``workers.engine.core_threads``: a batch's parts at once, one torch thread each); ``num_threads``
        instead runs every batch whole on one team of that many threads."""
        super().setup(num_threads, cpu_affinity)
        cores = len(physical_cores(available_cpus()))
        self._core_threads = 1 if num_threads else cores
        torch.set_num_threads(num_threads or 1)

    def token_bucket(self, n_tokens: int) -> int:
        """Rounded up to one of 16 steps an octave (at least 16 rows; at most 6.25% more): oneDNN builds a
        GEMM primitive for each new row count (10-20 ms for each of a layer's four shapes, measured here),
        so exact counts, new with nearly every batch, would pay that each batch; buckets pay it once."""
        step = max(16, 1 << max(0, n_tokens.bit_length() - 5))
        return -(-n_tokens // step) * step

    def core_threads(self) -> int:
        return self._core_threads

    def device_name(self) -> str:
        return cpu_model()

    def memory_report(self) -> dict[str, int]:
        """Host memory: ``total`` RAM, and this process's peak resident set (``peak_rss``)."""
        report = {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # KiB on Linux
        if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
            report["total"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return report

    def attention(self, dtype: torch.dtype) -> AttentionFn:
        """bf16 on a CPU the packed C kernel runs on (``kernels.cpu_attention``), fp32 on one with AVX2 and FMA
        (its fp32 kernel, ``kernels.cpu_attention_f32``): the packed attention, with no group plan; else
        grouped SDPA (always with ``POOLGATE_CPU_KERNELS=off``)."""
        if not kernels_off() and _packed_off(dtype) is None:
            return cpu_attention.packed_cpu_attention
        return grouped_sdpa

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Say once (a warning) when ``dtype`` runs on a slow path on this CPU (``SLOW_DTYPES``)."""
        _say_slow(str(dtype).removeprefix("torch."), cpu_class().name)

    def kernels(self, dtype: torch.dtype) -> dict[str, str]:
        """The CPU class, and per op the kernel and why not poolgate's own (``Backend.kernels``)."""
        bf16, name = dtype == torch.bfloat16, str(dtype).removeprefix("torch.")
        if kernels_off():
            off = f"torch ({KERNELS_ENV}=off)"
            return {"cpu_class": cpu_class().name, "attention": f"grouped_sdpa ({KERNELS_ENV}=off)",
                    "layer_norm": off, "linear": off}
        attention_off, norm_off = _packed_off(dtype), fused_norm.unavailable()
        attention = self._packed_attention(dtype) if attention_off is None else f"grouped_sdpa ({attention_off})"
        norm = "fused add + LayerNorm (C)" if bf16 and norm_off is None else \
            f"torch ({norm_off or 'the C kernel runs bf16 only'})"
        if dtype == torch.float32:
            norm = "torch, the residual added in place (no fp32 C kernel: add + LayerNorm are ~3% of the forward)"
        path = dtype_path(name, cpu_flags())
        if bf16 and packed_linear_available():
            linear = "oneDNN, bf16 weights prepacked, GELU/ReLU fused"
        elif dtype == torch.float32 and dnn_linear_available():
            gelu_off = gelu_f32.unavailable()
            gelu = "tanh GELU: C, AVX2+FMA" if gelu_off is None else f"tanh GELU: torch ({gelu_off})"
            linear = ("oneDNN, fp32 weights prepacked, bias fused, activation in place after (oneDNN's fused GELU "
                      f"and MKL's packed sgemm measured slower in fp32; {gelu}; erf GELU: torch, measured faster)")
        elif dtype == torch.float32:
            linear = "torch (MKL sgemm; the oneDNN fp32 prepacking is measured on AVX2 and larger classes only)"
        else:
            linear = "torch" + ("" if path == "native" else f" ({SLOW_DTYPES[(name, path)]})")
        return {"cpu_class": cpu_class().name, "attention": attention, "layer_norm": norm, "linear": linear}

    def _packed_attention(self, dtype: torch.dtype) -> str:
        """What the packed attention runs for each head dim of the model ``optimize`` saw (before one: the
        head-dim-32 build the CPU check made): its build, or SDPA per sequence and why."""
        dims = self._head_dims or {32: None}
        fp32 = dtype == torch.float32
        builds = sorted({"fp32, AVX2+FMA" if fp32 else "AMX tiles" if cpu_attention.uses_amx(d) else "AVX512-BF16"
                         for d, why in dims.items() if why is None})
        lines = [f"packed_cpu_attention (C, {', '.join(builds)})"] if builds else []
        return " and ".join(lines + [f"SDPA per sequence for head dim {d} ({why})"
                                     for d, why in sorted(dims.items()) if why is not None])

    def optimize(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        """Build (or load) the packed attention for each head dim ``model`` attends with, now, so no request
        builds one and a failed build is in the start-up table (``cpu_attention.prepare``); then ``finalize``."""
        if dtype in (torch.bfloat16, torch.float32):
            dims = {m.head_dim for m in model.modules()
                    if getattr(m, "attention", None) is cpu_attention.packed_cpu_attention}
            prepare = cpu_attention.prepare if dtype == torch.bfloat16 else cpu_attention_f32.prepare
            self._head_dims = {d: prepare(d) for d in sorted(dims)} or None
        super().optimize(model, dtype)

    def ops(self, dtype: torch.dtype) -> Ops:
        """Where the C kernels run: the packed attention and the fused add + LayerNorm for every dtype where the
        bf16 kernels run (they hand fp32 to the fp32 attention kernel or the references, so a model built in
        fp32 runs bf16 once cast: ``--dtype auto`` builds once); elsewhere the packed attention for fp32 where
        the AVX2 kernel runs (``attention``); bf16: every linear prepacked for oneDNN with GELU fused
        (``prepack_linears``); fp32 on AVX2 and larger classes: every linear prepacked for oneDNN, bias fused
        (``dnn_linears``), and the LayerNorm's residual added in place (``AddInPlaceLayerNorm``). Nothing of it
        with ``POOLGATE_CPU_KERNELS=off``."""
        self.check_dtype(dtype)
        ops = super().ops(dtype)
        if kernels_off():
            return ops
        if cpu_attention.unavailable() is None:
            ops = replace(ops, attention=cpu_attention.packed_cpu_attention)
        if fused_norm.unavailable() is None:  # its fp32 rows add the residual in place, as below
            ops = replace(ops, layer_norm=fused_norm.fused_layer_norm)
        elif dtype == torch.float32:
            ops = replace(ops, layer_norm=add_in_place_layer_norm)
        if dtype == torch.bfloat16 and packed_linear_available():
            return replace(ops, finalize=prepack_linears)
        if dtype == torch.float32 and dnn_linear_available():
            return replace(ops, finalize=dnn_linears)
        return ops


def _packed_off(dtype: torch.dtype) -> str | None:
    """Why the packed attention does not run ``dtype`` here (bf16: its kernel; fp32: the AVX2 one), or None."""
    if dtype == torch.bfloat16:
        return cpu_attention.unavailable()
    if dtype == torch.float32:
        return cpu_attention_f32.unavailable()
    return "the C kernels run bf16 and fp32 only"


def kernels_off() -> bool:
    """Whether ``POOLGATE_CPU_KERNELS=off`` asks for torch's reference path for every op (no C kernel, no
    prepacking): what a CPU without the kernels' instructions or a compiler runs, on any machine."""
    return os.environ.get(KERNELS_ENV, "").lower() == "off"


@cache
def _say_slow(dtype: str, cpu_class_name: str) -> None:
    path = dtype_path(dtype, cpu_flags())
    note = SLOW_DTYPES.get((dtype, path))
    if note is not None:
        log.warning("--dtype %s on this CPU (class %s): %s (docs/operations.md#cpu-classes); --dtype auto picks "
                    "%s here", dtype, cpu_class_name, note, "bfloat16" if cpu_flags() & BF16_FLAGS else "float32")
