"""Packed attention on x86 CPUs with AVX512-BF16: a C kernel over the whole padding-free batch.

``packed_attention.c`` (beside this file) is built with the machine's C
compiler (``$CC``, else ``cc``/``gcc``) into one shared object per head
dimension, cached under ``$POOLGATE_KERNEL_CACHE`` (default
``~/.cache/poolgate/kernels``): ahead by ``poolgate build-kernels``
(``prebuild``), else for the model's head dims while the CPU backend loads it
(``prepare``), never inside a request. It is the ``torch.library`` op
``poolgate::packed_attention`` (``workers.kernels.custom_ops``), whose CPU
kernel calls the C function through ctypes, which lets go of the GIL for the
call. It reads q, k and v where the QKV projection left them
(no gather, no padding, no group plan) and writes each token's output in
place, one (sequence, head) at a time, the two products on AMX tiles where the
CPU has AMX-BF16 (else VDPBF16PS), an exact fp32 softmax between them.
Measured on this project's 2-core Xeon, one thread, 4,096 tokens of 12 heads
of 32 in bf16, against grouped SDPA (torch's CPU flash kernel): AMX 6.5x at 16
tokens a sequence, 8x at 85, 4.5x at 250, 2x at 512; AVX512-BF16 alone 3.3x
at 16-40 tokens, 2x at 85, 1.1x at 128-144, even at 160 and slower past it
(``AVX512_MAX_LEN``). On the CI's AMD EPYC (Zen 4, AVX512-BF16, no AMX), where
that build is the default, it is 2.5-3.6x SDPA at every length from 96 to
2,048 tokens, so there it takes every length (``avx512_max_len``).

``packed_cpu_attention`` has the ``kernels.attention`` contract. It runs bf16
with a head dimension that is a multiple of 16 (at most 256), causal or not,
with windows and grouped-query heads. A relative bias, a soft cap or masked
keys go to ``grouped_sdpa`` (such batches and models always carry the group
plan); fp32 q/k/v go to the fp32 kernel (``cpu_attention_f32``: AVX2 and FMA,
head dims in steps of 8) where it runs; another dtype or head dimension runs
SDPA per sequence (exact, slow, logged once). ``unavailable()`` says why the kernel cannot run here (no
AVX512-BF16, no compiler, a failed build), or None; the CPU backend picks
the kernel only when it is None, and ``prepare`` says why it cannot run one
head dim.
"""
from __future__ import annotations

import ctypes
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F

from poolgate.workers.batch.packing import PackedBatch
from poolgate.shared.config.cpu import cpu_flags, cpu_vendor
from poolgate.workers.kernels import cbuild, cpu_attention_f32, custom_ops
from poolgate.workers.kernels.attention import RelativeBias, grouped_sdpa

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("packed_attention.c")
AMX_FLAGS = frozenset({"amx_tile", "amx_bf16"})
AMX_CFLAGS = ("-DPOOLGATE_AMX", "-mamx-tile", "-mamx-bf16")
MODE_ENV = "POOLGATE_CPU_ATTENTION"  # "sdpa": grouped SDPA even where the kernel runs; "avx512": never AMX
# packed_attention.c's exported functions (poolgate_amx_init: the AMX builds only), as cbuild.bind types them
SIGNATURES: dict[str, cbuild.Signature] = {
    "poolgate_attend": (ctypes.c_int, (ctypes.c_void_p,) * 3 + (ctypes.c_int64,) * 3 + (
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p) + (ctypes.c_int64,) * 3 + (ctypes.c_float, ctypes.c_int)
        + (ctypes.c_int64,) * 5),
    "poolgate_amx_init": (ctypes.c_int, ()),
}
# Sequences longer than this go to SDPA on the AVX512-BF16 build on an Intel CPU: measured on the project's
# Xeon (12 heads of 32, bf16, one thread), the kernel is 3.3x SDPA at 16-40 tokens, 2x at 85, even at 160 and
# 0.9x at 192 (AMX: 2x at 512). That Xeon issues VDPBF16PS once every ~2.2 cycles; AMD's Zen 4 does not
# slow down so: see avx512_max_len.
AVX512_MAX_LEN = 160
SPLIT_WORK = 1 << 20  # heads x length^2 from which a team of threads splits a batch (a thread costs ~0.1 ms)


def supported_head_dim(head_dim: int) -> bool:
    return head_dim % 16 == 0 and 16 <= head_dim <= 256


def _variant(head_dim: int, amx: bool) -> tuple[tuple[str, ...], str]:
    """The compiler flags and the file tag of one build."""
    return (*(AMX_CFLAGS if amx else ()), f"-DHD={head_dim}"), f"_hd{head_dim}{'_amx' if amx else ''}"


def _build(head_dim: int, amx: bool) -> Path:
    """The shared object for ``head_dim`` (on AMX or not), built once (``kernels.cbuild``)."""
    return cbuild.build(SOURCE, *_variant(head_dim, amx))


def _mode() -> str:
    return os.environ.get(MODE_ENV, "auto").lower()


@cache
def _amx() -> bool:
    """Whether the AMX build runs here: the CPU has AMX-BF16 and the kernel grants this process the tiles."""
    if _mode() == "avx512" or not AMX_FLAGS <= cpu_flags():
        return False
    return cbuild.bind(cbuild.load(SOURCE, *_variant(32, True)), "poolgate_amx_init", SIGNATURES)() == 0


@cache
def avx512_max_len() -> int | None:
    """The longest sequence the AVX512-BF16 build takes here (longer ones go to SDPA), None for every length.
    AMD: every length; measured on the CI's EPYC (Zen 4, 12 heads, one thread, 8,192 tokens a call) the kernel
    is 2.5-3.6x SDPA from 96 to 2,048 tokens at head dim 32 (3.0x at 96, 3.5x at 160, 2.8x at 256, 2.5x at
    2,048), 2.4-3.2x to 1,024 at 64 and 2.0-2.2x to 512 at 128, where the 160 cap had sent 55% of the bundled
    model's attention work (sequences past 160 tokens) to SDPA. Elsewhere ``AVX512_MAX_LEN``."""
    return None if cpu_vendor() == "AuthenticAMD" else AVX512_MAX_LEN


def uses_amx(head_dim: int) -> bool:
    return head_dim % 32 == 0 and _amx()


def _kernel(head_dim: int):
    """The kernel's entry point for ``head_dim``; raises RuntimeError (every time, built once) when it cannot."""
    fn, reason = _loaded(head_dim)
    if fn is None:
        raise RuntimeError(reason)
    return fn


@cache
def _loaded(head_dim: int):
    """(entry point, None) or (None, why): a failed build is remembered, never tried again on every call."""
    try:
        lib = cbuild.load(SOURCE, *_variant(head_dim, uses_amx(head_dim)))
    except (OSError, RuntimeError) as exc:
        return None, str(exc)
    return cbuild.bind(lib, "poolgate_attend", SIGNATURES), None


@cache
def unavailable() -> str | None:
    """Why the kernel cannot run on this machine, or None when it can (checked once: flags, compiler, a build)."""
    if _mode() == "sdpa":
        return f"{MODE_ENV}=sdpa"
    missing = cbuild.AVX512_BF16_FLAGS - cpu_flags()
    if missing:
        return f"the CPU lacks {', '.join(sorted(missing))}"
    try:
        _kernel(32)
    except (OSError, RuntimeError) as exc:
        return f"the kernel did not build: {exc}"
    return None


def prepare(head_dim: int) -> str | None:
    """Build and load the kernel for ``head_dim`` now (the CPU backend, at model load, for each head dim the
    model attends with): why it cannot run that head dim (SDPA per sequence runs it), or None."""
    if not supported_head_dim(head_dim):
        return f"the kernel takes head dims of 16 to 256 in steps of 16, not {head_dim}"
    reason = _loaded(head_dim)[1]
    return None if reason is None else f"no build for head dim {head_dim}: {reason}"


@cache
def _warn_slow(reason: str) -> None:
    log.warning("packed CPU attention: %s; running SDPA per sequence (exact, slower)", reason)


def _per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, *, scale: float,
                  causal: bool, window: tuple[int, int] | None) -> torch.Tensor:
    """SDPA one sequence at a time, for what the kernel does not take and a batch without a group plan."""
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    _long_sequences(q, k, v, batch, out, 0, scale=scale, causal=causal, window=window)
    out[int(batch.cu_seqlens[-1]):].zero_()
    return out


def _long_sequences(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, out: torch.Tensor,
                    max_len: int, *, scale: float, causal: bool, window: tuple[int, int] | None) -> None:
    """SDPA for each sequence longer than ``max_len``, into ``out``."""
    from poolgate.workers.kernels.attention import allowed

    cu = batch.cu_seqlens.tolist()
    for s, e in zip(cu[:-1], cu[1:]):
        if e - s > max_len:
            rule = allowed(e - s, causal=causal, window=window, device=q.device)
            o = F.scaled_dot_product_attention(q[s:e].transpose(0, 1)[None], k[s:e].transpose(0, 1)[None],
                                               v[s:e].transpose(0, 1)[None], attn_mask=rule, scale=scale,
                                               enable_gqa=k.shape[1] != q.shape[1])
            out[s:e] = o[0].transpose(0, 1)


def _takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel reads q, k and v as they are: bf16 on the CPU, heads and dims packed in each token's
    row (any token stride; keys' even, as they are gathered in bf16 pairs), one head dim it is built for."""
    head_dim = q.shape[2]  # written out flat: this runs on every call
    return (q.dtype == k.dtype == v.dtype == torch.bfloat16 and q.is_cpu and k.is_cpu and v.is_cpu
            and q.stride()[1:] == k.stride()[1:] == v.stride()[1:] == (head_dim, 1) and k.stride(0) % 2 == 0
            and k.shape[2] == v.shape[2] == head_dim and q.shape[1] % k.shape[1] == 0 and supported_head_dim(head_dim))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float, causal: bool,
            left: int, right: int, max_len: int, bounds: list[int]) -> torch.Tensor:
    """``poolgate::packed_attention`` on CPU tensors: the (n, heads, head_dim) output of every sequence up to
    ``max_len`` tokens (rows of longer ones and past the last sequence are left unwritten), its (sequence, head)
    items ``bounds[i]:bounds[i+1]`` each on a thread of its own. It trusts its eager caller
    (``packed_cpu_attention`` checks what it hands on, ``_takes``): a check here would cost ~1.6 µs a call;
    under tracing the fake checks the same."""
    n, heads, head_dim = q.shape
    out = q.new_empty(n, heads, head_dim)  # (n_tokens, heads, head_dim)
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0), k.stride(0), v.stride(0), out.data_ptr(),
            out.stride(0), cu_seqlens.data_ptr(), cu_seqlens.shape[0] - 1, heads, k.shape[1], scale, int(causal),
            left, right, max_len)
    if any(cbuild.run_split(_kernel(head_dim), args, list(zip(bounds[:-1], bounds[1:], strict=True)))):
        raise MemoryError("packed CPU attention could not allocate its scratch memory")
    return out


def _attend_fake(q, k, v, cu_seqlens, scale, causal, left, right, max_len, bounds):
    """The output's shape under tracing (``torch.compile``, ``make_fx``), once the inputs are what the kernel
    takes (ValueError else: a compiled graph never hands the C code another layout)."""
    if not (_takes(q, k, v) and cu_seqlens.dtype == torch.int32 and cu_seqlens.is_contiguous()):
        raise ValueError("poolgate::packed_attention takes bf16 q/k/v of packed heads and int32 cu_seqlens")
    return q.new_empty(q.shape[0], q.shape[1], v.shape[-1])


ATTEND = custom_ops.define("packed_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float scale, "
                           "bool causal, int left, int right, int max_len, int[] bounds) -> Tensor",
                           _attend, _attend_fake)


def _splits(lengths: list[int], heads: int, parts: int) -> list[tuple[int, int]]:
    """Item ranges (sequence-major, ``heads`` items a sequence) of about equal attention cost (length squared)."""
    cost = [n * n for n in lengths]
    total, bounds, acc = sum(cost), [0], 0
    for s, c in enumerate(cost):
        acc += c
        if len(bounds) < parts and acc >= total * len(bounds) / parts and s + 1 < len(lengths):
            bounds.append((s + 1) * heads)
    bounds.append(len(lengths) * heads)
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def packed_cpu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, *, scale: float,
                         causal: bool = False, window: tuple[int, int] | None = None,
                         bias: RelativeBias | None = None, softcap: float | None = None) -> torch.Tensor:
    """The ``kernels.attention`` contract on the C kernel (see the module docstring for what it hands on)."""
    if bias is not None or softcap is not None or batch.key_masked:
        return grouped_sdpa(q, k, v, batch, scale=scale, causal=causal, window=window, bias=bias, softcap=softcap)
    n, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if (q.dtype == torch.float32 and cpu_attention_f32.unavailable() is None and cpu_attention_f32.takes(q, k, v)
            and cpu_attention_f32.loaded(head_dim)[0] is not None):  # fp32: the AVX2 kernel (cpu_attention_f32)
        return _run(cpu_attention_f32.ATTEND, q, k, v, batch, batch.max_len, scale=scale, causal=causal,
                    window=window)
    if not _takes(q, k, v) or unavailable() is not None:  # (bf16 on a CPU without AVX512-BF16: never the C code)
        if batch.groups is not None:
            return grouped_sdpa(q, k, v, batch, scale=scale, causal=causal, window=window)
        _warn_slow(f"{q.dtype} q/k/v of head dim {head_dim} ({heads} heads over {kv_heads})")
        return _per_sequence(q, k, v, batch, scale=scale, causal=causal, window=window)
    try:
        _kernel(head_dim)
    except (OSError, RuntimeError) as exc:  # built for head dim 32 here, but not for this one
        _warn_slow(f"no build for head dim {head_dim} ({exc})")
        return _per_sequence(q, k, v, batch, scale=scale, causal=causal, window=window)
    max_len = batch.max_len if uses_amx(head_dim) else (avx512_max_len() or batch.max_len)
    return _run(ATTEND, q, k, v, batch, max_len, scale=scale, causal=causal, window=window)


def _run(op: custom_ops.KernelOp, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch,
         max_len: int, *, scale: float, causal: bool, window: tuple[int, int] | None) -> torch.Tensor:
    """One of the packed kernels (``op``: bf16 or fp32) over the batch, its items split between the threads,
    SDPA for the sequences over ``max_len``, zeros for the rows past the last sequence."""
    n, heads = q.shape[0], q.shape[1]
    cu = batch.cu_seqlens
    if cu.dtype != torch.int32 or not cu.is_contiguous():
        cu = cu.to(torch.int32).contiguous()
    nseq = cu.shape[0] - 1
    left, right = (-1, -1) if window is None else window
    threads = torch.get_num_threads()  # a batch on a team of threads: its items split between them
    split = threads > 1 and sum(length * length for length in batch.lengths) * heads >= SPLIT_WORK
    bounds = [0] + [b for _, b in _splits(batch.lengths, heads, threads)] if split else [0, nseq * heads]
    out = op(q, k, v, cu, scale, causal, left, right, max_len, bounds)  # (n, heads, head_dim)
    if batch.max_len > max_len:  # the sequences the kernel left: SDPA each
        _long_sequences(q, k, v, batch, out, max_len, scale=scale, causal=causal, window=window)
    last = int(batch.cu_seqlens[-1])
    if last < n:  # rows past the last sequence (a padded token bucket) are no sequence's: zeros
        out[last:].zero_()
    return out


HEAD_DIMS = tuple(range(16, 257, 16))  # every head dim the kernel takes


def prebuild(head_dims: list[int], jobs: int | None = None) -> list[Path]:
    """Build every attention variant for ``head_dims`` (AVX512-BF16, AMX for multiples of 32, fp32 AVX2) and
    the fused LayerNorm and the fp32 GELU into the cache, ``jobs`` compilers at once (default: one per CPU); the paths, in order
    (``poolgate build-kernels``, an image's build step; no CPU check: any x86 gcc). Raises RuntimeError for
    no compiler or a failed build, ValueError for a head dim the kernel does not take."""
    from poolgate.workers.kernels import fused_norm, gelu_f32

    bad = [d for d in head_dims if not supported_head_dim(d)]
    if bad:
        raise ValueError(f"the kernel takes head dims of 16 to 256 in steps of 16, not {', '.join(map(str, bad))}")
    builds = [(SOURCE, *_variant(d, amx)) for d in head_dims for amx in ((False, True) if d % 32 == 0 else (False,))]
    builds += [cpu_attention_f32.variant(d) for d in head_dims]
    builds.append((fused_norm.SOURCE, (), ""))
    builds.append((gelu_f32.SOURCE, (), "", cbuild.AVX2_CFLAGS))
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        return list(pool.map(lambda b: cbuild.build(*b), builds))
