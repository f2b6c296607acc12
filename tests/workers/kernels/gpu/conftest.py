"""The Triton kernels run under Triton's interpreter here (CPU tensors): ``TRITON_INTERPRET=1`` for each test.

The variable is set for the test only (no other test of the session sees it),
and the kernel modules (``kernels.gpu.jit``, ``pool_jit``) are dropped before and after it: ``triton.jit``
decides at decoration whether a kernel is interpreted, so the test's first
launch imports the kernels afresh as interpreted ones, and a GPU test after it
gets compiled ones again. The kernels call no triton function jitted at
triton's own import, so when triton was imported does not matter. Without
triton every test here is skipped with the reason. Tests marked ``cuda`` (``test_compiled.py``) run
the kernels compiled, on a GPU, with the interpreter off.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from poolgate.workers.kernels import gpu
from poolgate.workers.kernels.gpu import INTERPRET_ENV

REASON = None if importlib.util.find_spec("triton") else "triton is not installed (pip install 'poolgate[test]')"


@pytest.fixture(autouse=True)
def interpreter(request, monkeypatch):
    if REASON is not None:
        pytest.skip(REASON)
    if request.node.get_closest_marker("cuda"):  # compiled for the GPU (test_compiled.py): no interpreter
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a GPU")
        monkeypatch.delenv(INTERPRET_ENV, raising=False)
    else:
        monkeypatch.setenv(INTERPRET_ENV, "1")
    _drop_kernels()
    yield
    _drop_kernels()


KERNEL_MODULES = ("jit", "pool_jit")  # the modules of ``kernels.gpu`` that hold kernels


def _drop_kernels() -> None:
    """Forget the kernel modules: the next launch imports (decorates) them under the environment of then."""
    for name in KERNEL_MODULES:
        sys.modules.pop(f"poolgate.workers.kernels.gpu.{name}", None)
        if hasattr(gpu, name):
            delattr(gpu, name)


class Launches:
    """A kernel of ``kernels.gpu.jit``, the real one, its launches counted."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid):
        self.count += 1
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch):
    """``launches()`` imports ``kernels.gpu.jit`` (interpreted) and counts each kernel's launches from then:
    {kernel name: Launches}."""

    def count() -> dict[str, Launches]:
        jit = importlib.import_module("poolgate.workers.kernels.gpu.jit")
        seen = {name: Launches(getattr(jit, name)) for name in ("norm_rows", "bias_act", "rope")}
        for name, spy in seen.items():
            monkeypatch.setattr(jit, name, spy)
        return seen

    return count


# tolerances per dtype, (atol, rtol): fp32 the reduction order and rsqrt; fp16 one rounding step (2^-10);
# bf16 two steps (2^-8 each): the interpreter rounds fp32 to bf16 toward zero where a GPU rounds to nearest
TOLERANCE = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2 ** -6)}


def close(got, want) -> None:
    """``got`` equals ``want`` within the dtype's tolerance, in the same dtype and shape."""
    import torch

    assert got.dtype == want.dtype and got.shape == want.shape
    atol, rtol = TOLERANCE[str(want.dtype).removeprefix("torch.")]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)
