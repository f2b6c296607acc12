"""Building poolgate's C kernels on the machine: one shared object per source and flags, cached, via ctypes.

The x86 CPU kernels (``packed_attention.c``, ``fused_norm.c``) ship as source
and are compiled with the machine's C compiler (``$CC``, else ``cc``/``gcc``)
ahead of use (``poolgate build-kernels``, an image's build step) or, where
that was not done, while a CPU worker loads its model (never in a request),
into ``$POOLGATE_KERNEL_CACHE`` (default ``~/.cache/poolgate/kernels``), named
by a hash of the source and the flags, so a build made earlier (or into an
image) is found without a compiler.
``bind`` gives an exported function the ctypes types its module declares
(checked against the C source by tests/workers/kernels/test_c_signatures.py).
ctypes lets go of the GIL during a call, so ``run_split`` can run one
kernel's work items on several threads at once.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

BASE_CFLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma",
               "-fPIC", "-shared")
AVX512_BF16_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"})
# the fp32 kernels for AVX2 CPUs (AMD Zen 2/3, Haswell): no AVX-512 instruction may reach their code
AVX2_CFLAGS = ("-O3", "-mavx2", "-mfma", "-fPIC", "-shared")
AVX2_FLAGS = frozenset({"avx2", "fma"})
_lock = threading.Lock()
# an exported C function's (restype, argtypes) in ctypes types: int64_t -> c_int64, int -> c_int, float -> c_float,
# a pointer -> c_void_p
Signature = tuple[type, tuple[type, ...]]


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cache_dir() -> Path:
    env = os.environ.get("POOLGATE_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "poolgate" / "kernels"


def build(source: Path, flags: Sequence[str], tag: str = "", base: Sequence[str] = BASE_CFLAGS) -> Path:
    """The shared object of ``source`` built with ``flags`` (after ``base``, by default ``BASE_CFLAGS``): made
    once, then reused."""
    flags = (*base, *flags)
    key = hashlib.sha256(source.read_bytes() + repr(flags).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}{tag}_{key}.so"
    if target.is_file():  # built before, here or into an image: no compiler needed
        return target
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (set CC, or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(source), "-o", tmp], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed on {source.name}: {done.stderr.strip()[-500:]}")
        os.chmod(tmp, 0o644)  # mkstemp made it 0600: a cache built by root (an image) is read by its user
        os.replace(tmp, target)  # atomic: two workers building at once both end with a whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load(source: Path, flags: Sequence[str], tag: str = "", base: Sequence[str] = BASE_CFLAGS) -> ctypes.CDLL:
    with _lock:
        return ctypes.CDLL(str(build(source, flags, tag, base)))


def bind(lib: ctypes.CDLL, name: str, signatures: dict[str, Signature]):
    """``lib``'s exported function ``name`` typed as ``signatures[name]`` says."""
    fn = getattr(lib, name)
    fn.restype, argtypes = signatures[name]
    fn.argtypes = list(argtypes)
    return fn


def run_split(fn: Callable[..., int], args: tuple, ranges: list[tuple[int, int]]) -> list[int]:
    """``fn(*args, start, stop)`` for each range, the first on this thread and the rest on threads of their own,
    all at once; the return codes in order."""
    codes = [0] * len(ranges)

    def run(i: int) -> None:
        codes[i] = fn(*args, *ranges[i])

    workers = [threading.Thread(target=run, args=(i,)) for i in range(1, len(ranges))]
    for w in workers:
        w.start()
    run(0)
    for w in workers:
        w.join()
    return codes
