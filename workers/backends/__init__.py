"""Hardware backends by name, and the ``auto`` choice among them."""
from __future__ import annotations

from poolgate.workers.backends.base import Backend
from poolgate.workers.backends.cpu import CpuBackend
from poolgate.workers.backends.cuda import CudaBackend, RocmBackend
from poolgate.workers.backends.xpu import XpuBackend

BACKENDS: dict[str, type[Backend]] = {
    "cuda": CudaBackend,
    "rocm": RocmBackend,
    "xpu": XpuBackend,
    "cpu": CpuBackend,
}
AUTO_ORDER = ("cuda", "rocm", "xpu", "cpu")


def get_backend(name: str) -> Backend:
    """The backend called ``name``, or the first available for ``auto``."""
    if name == "auto":
        return next(b for b in (BACKENDS[n]() for n in AUTO_ORDER) if b.available())
    backend = BACKENDS[name]()
    if not backend.available():
        raise RuntimeError(f"backend {name!r} is not available in this process")
    return backend
