"""The Triton kernels' tests run in Triton's interpreter (on CPU tensors): ``TRITON_INTERPRET=1`` for each test.

``triton.jit`` decides at decoration whether a kernel is interpreted, so the
kernels module (``kernels.gpu.pool_jit``) is dropped before and after each test
and imported afresh by its first launch. Without triton every test is skipped.
"""
import importlib.util
import sys

import pytest

from poolgate.workers.kernels.gpu import INTERPRET_ENV

REASON = None if importlib.util.find_spec("triton") else "triton is not installed"
KERNEL_MODULES = ("poolgate.workers.kernels.gpu.pool_jit",)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    if REASON is not None:
        pytest.skip(REASON)
    monkeypatch.setenv(INTERPRET_ENV, "1")
    _drop_kernels()
    yield
    _drop_kernels()


def _drop_kernels() -> None:
    from poolgate.workers.kernels import gpu

    for name in KERNEL_MODULES:
        sys.modules.pop(name, None)
        if hasattr(gpu, name.rsplit(".", 1)[1]):
            delattr(gpu, name.rsplit(".", 1)[1])
