"""What this CPU can run: its flags, its class, the override showing a smaller one, each dtype's path (torch-free).

poolgate sorts x86 CPUs into classes, each a superset of the one before
(the ``/proc/cpuinfo`` flags it adds; the oneDNN and ATen caps that show it):

- ``generic``: none (ARM64, pre-2013 x86); ``SSE41``, ``default``, ``SSE4_2``.
- ``avx2``: avx2, fma (AMD Zen 2/3, Haswell); ``AVX2``, ``avx2``, ``AVX2``.
- ``avx512``: avx512f/bw/vl/dq (Skylake-SP, Ice Lake); ``AVX512_CORE``, ``avx512``, ``AVX512``.
- ``avx512_bf16``: avx512_bf16 (AMD Zen 4/5, Cooper Lake); ``AVX512_CORE_BF16``, ``avx512``, ``AVX512``.
- ``amx``: amx_tile, amx_bf16 (Sapphire Rapids and later); ``AVX512_CORE_AMX``, ``avx512``, none.

``POOLGATE_CPU_CLASS`` (one of those names) makes poolgate's own detection
see a smaller CPU than the machine's: the flags of every class above it are
hidden from ``cpu_flags()``. An ``ONEDNN_MAX_CPU_ISA`` set on its own below the
machine's class does the same (``seen_class``): oneDNN then lacks the bigger
class's paths (its bf16 path below AVX512), so poolgate must not choose them.
``apply_cpu_class`` (called at each process's edge: the ``poolgate`` command,
the worker, the test suite) also caps oneDNN,
ATen and MKL to the same class through their own variables
(``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS``)
unless those are set, so torch's kernels take the smaller CPU's paths too
(MKL runs torch's fp32 matmuls: without its cap, an AMX Xeon shown as
``avx2`` still ran them with AVX512, at twice an AVX2 core's peak).
All three caps are read lazily (at the first kernel), so they work while
nothing has run yet. An
override above the machine's class is refused: it cannot add instructions.

``dtype_path`` says how a CPU of these flags computes a dtype's matmuls:
``native`` (its own instructions: AVX512-BF16, AMX, AVX512-FP16), ``onednn``
(oneDNN converts to fp32 in registers: bf16 on AVX512BW/VL/DQ or
AVX-NE-CONVERT) or ``fallback`` (torch's reference loops: correct, and on the
AVX2 class ~9x slower than float32, measured; see docs/operations.md).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CPU_CLASS_ENV = "POOLGATE_CPU_CLASS"
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuClass:
    """One class: the flags it needs (with those of every class below) and the caps that show it to torch."""

    name: str
    needs: frozenset[str]
    onednn_isa: str  # ONEDNN_MAX_CPU_ISA
    aten: str  # ATEN_CPU_CAPABILITY
    mkl: str  # MKL_ENABLE_INSTRUCTIONS ("" for the class no machine is capped to)


def _classes() -> tuple[CpuClass, ...]:
    steps: list[tuple[str, tuple[str, ...], str, str, str]] = [
        ("generic", (), "SSE41", "default", "SSE4_2"),
        ("avx2", ("avx2", "fma"), "AVX2", "avx2", "AVX2"),
        ("avx512", ("avx512f", "avx512bw", "avx512vl", "avx512dq"), "AVX512_CORE", "avx512", "AVX512"),
        ("avx512_bf16", ("avx512_bf16",), "AVX512_CORE_BF16", "avx512", "AVX512"),
        ("amx", ("amx_tile", "amx_bf16"), "AVX512_CORE_AMX", "avx512", ""),
    ]
    out: list[CpuClass] = []
    needs: frozenset[str] = frozenset()
    for name, adds, isa, aten, mkl in steps:
        needs = needs | set(adds)
        out.append(CpuClass(name, needs, isa, aten, mkl))
    return tuple(out)


CPU_CLASSES: tuple[CpuClass, ...] = _classes()  # smallest first
CLASS_NAMES: tuple[str, ...] = tuple(c.name for c in CPU_CLASSES)
# The SIMD flags an override may hide: every one a class above ``generic`` is told apart by, and their kin.
_ISA_PREFIXES = ("avx512", "amx", "avx_vnni", "avx_ne_convert", "avx_ifma", "avx10")
_ISA_FLAGS = frozenset({"avx2", "fma"})


def _cpuinfo(field: str, cpuinfo: Path) -> str:
    """The first CPU's ``field`` in /proc/cpuinfo (empty off Linux or when absent)."""
    if not cpuinfo.is_file():
        return ""
    for line in cpuinfo.read_text().splitlines():
        if line.split(":", 1)[0].strip() == field:
            return line.split(":", 1)[1].strip()
    return ""


def machine_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    """The feature flags the kernel reports for the first CPU (x86 ``flags``, ARM ``Features``; empty off Linux)."""
    return set((_cpuinfo("flags", cpuinfo) or _cpuinfo("Features", cpuinfo)).split())


def cpu_vendor(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's vendor id ("GenuineIntel", "AuthenticAMD"; empty off Linux)."""
    return _cpuinfo("vendor_id", cpuinfo)


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name as the kernel reports it (empty off Linux)."""
    return _cpuinfo("model name", cpuinfo) or platform.processor()


def class_of(flags: set[str] | frozenset[str]) -> CpuClass:
    """The biggest class whose flags ``flags`` has."""
    return [c for c in CPU_CLASSES if c.needs <= flags][-1]


def class_named(name: str) -> CpuClass:
    for c in CPU_CLASSES:
        if c.name == name:
            return c
    raise ValueError(f"{CPU_CLASS_ENV}={name!r} is not a CPU class; use one of {', '.join(CLASS_NAMES)}")


def shown_flags(flags: set[str], override: str | None) -> set[str]:
    """``flags`` as a CPU of class ``override`` shows them (None: as they are); ValueError for an override above
    the class of ``flags``, or not a class."""
    if not override:
        return set(flags)
    want, have = class_named(override), class_of(flags)
    if CLASS_NAMES.index(want.name) > CLASS_NAMES.index(have.name):
        raise ValueError(
            f"{CPU_CLASS_ENV}={want.name} asks for more than this CPU has (class {have.name}); "
            "the override can only show a smaller CPU"
        )
    if want.name == have.name:
        return set(flags)
    hidden = {f for f in flags if f.startswith(_ISA_PREFIXES) or f in _ISA_FLAGS} - want.needs
    return set(flags) - hidden


def override(environ: Mapping[str, str] | None = None) -> str | None:
    """The class ``POOLGATE_CPU_CLASS`` asks for, or None."""
    return (os.environ if environ is None else environ).get(CPU_CLASS_ENV) or None


# ONEDNN_MAX_CPU_ISA -> the biggest class whose paths oneDNN then has (its own names, old and new).
ONEDNN_CLASSES = {
    "SSE41": "generic",
    "AVX": "generic",
    "AVX2": "avx2",
    "AVX2_VNNI": "avx2",
    "AVX2_VNNI_2": "avx2",
    "AVX512_CORE": "avx512",
    "AVX512_CORE_VNNI": "avx512",
    "AVX512_CORE_BF16": "avx512_bf16",
    "AVX512_CORE_FP16": "avx512_bf16",
    "AVX10_1_512": "avx512_bf16",
    "AVX512_CORE_AMX": "amx",
    "AVX10_1_512_AMX": "amx",
    "AVX512_CORE_AMX_FP16": "amx",
    "AVX10_1_512_AMX_FP16": "amx",
}


def seen_class(flags: set[str] | frozenset[str], environ: Mapping[str, str]) -> str | None:
    """The class this process runs as: ``POOLGATE_CPU_CLASS``, or smaller where ``ONEDNN_MAX_CPU_ISA`` caps
    oneDNN below it on its own (its bf16 path then goes, so poolgate must not prepack for it); None: the
    machine's own. ValueError for a ``POOLGATE_CPU_CLASS`` that is not a class or above the machine."""
    name = override(environ)
    if name is not None:
        shown_flags(set(flags), name)  # checks it
    capped = ONEDNN_CLASSES.get(environ.get("ONEDNN_MAX_CPU_ISA", "").upper())
    names = [n for n in (name, capped) if n is not None]
    if not names:
        return None
    smallest = min(names, key=CLASS_NAMES.index)
    return smallest if CLASS_NAMES.index(smallest) < CLASS_NAMES.index(class_of(flags).name) else None


@cache
def cpu_flags() -> frozenset[str]:
    """This process's view of the CPU's flags: the machine's, less what ``POOLGATE_CPU_CLASS`` (or a smaller
    ``ONEDNN_MAX_CPU_ISA``) hides."""
    flags = machine_flags()
    return frozenset(shown_flags(flags, seen_class(flags, os.environ)))


def cpu_class() -> CpuClass:
    """This process's CPU class (``POOLGATE_CPU_CLASS`` where set)."""
    return class_of(cpu_flags())


def apply_cpu_class(environ: MutableMapping[str, str] | None = None, flags: set[str] | None = None) -> CpuClass | None:
    """At a process's edge: check ``POOLGATE_CPU_CLASS`` against the machine (ValueError: not a class, or above
    it) and cap oneDNN, ATen and MKL to that class where the environment has not capped them. The class, or None."""
    environ = os.environ if environ is None else environ
    name = override(environ)
    if name is None:
        return None
    flags = machine_flags() if flags is None else flags
    shown = class_of(shown_flags(flags, name))
    if shown != class_of(flags):  # a smaller class than the machine's (the machine's own needs no cap)
        environ.setdefault("ONEDNN_MAX_CPU_ISA", shown.onednn_isa)
        environ.setdefault("ATEN_CPU_CAPABILITY", shown.aten)
        environ.setdefault("MKL_ENABLE_INSTRUCTIONS", shown.mkl)
    return shown


_ARM_BF16, _ARM_FP16 = "bf16", "asimdhp"
BF16_INSTRUCTIONS = frozenset({"avx512_bf16", "amx_bf16"})  # x86 flags with bf16 dot products
_X86_FP16_NATIVE = frozenset({"avx512_fp16", "amx_fp16"})
_ONEDNN_BF16 = frozenset({"avx512bw", "avx512vl", "avx512dq"})  # oneDNN's bf16 on AVX512 without BF16 insns


def dtype_path(dtype: str, flags: set[str] | frozenset[str]) -> str:
    """How a CPU with ``flags`` computes ``dtype`` ("float32", "bfloat16", "float16"): "native", "onednn" or
    "fallback" (see the module docstring)."""
    if dtype == "float32":
        return "native"
    if dtype == "bfloat16":
        if flags & BF16_INSTRUCTIONS or _ARM_BF16 in flags:
            return "native"
        return "onednn" if flags >= _ONEDNN_BF16 or "avx_ne_convert" in flags else "fallback"
    if dtype == "float16":
        return "native" if flags & _X86_FP16_NATIVE or _ARM_FP16 in flags else "fallback"
    raise ValueError(f"no such dtype: {dtype!r}")
