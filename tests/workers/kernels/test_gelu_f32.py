"""The fp32 GELU C kernel (``kernels.gelu_f32``, AVX2+FMA) against torch's ``F.gelu``, its fallback, and its report.

Tolerance: |got - F.gelu| <= 2e-6 over [-10, 10] (both forms; torch's own erf GELU is ~1.2e-6 off a float64
reference there, the kernel ~4e-7), tighter against float64 (5e-7 + 1e-6 relative).
"""
import pytest
import torch
import torch.nn.functional as F

from poolgate.workers.backends import cpu
from poolgate.workers.backends.cpu import CpuBackend
from poolgate.workers.kernels import gelu_f32, linear_fp32
from poolgate.workers.kernels.linear import Linear
from poolgate.workers.kernels.linear_fp32 import DnnLinear

runs = pytest.mark.skipif(gelu_f32.unavailable() is not None, reason=f"no GELU kernel: {gelu_f32.unavailable()}")
onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
FORMS = [False, True]


def _approximate(tanh: bool) -> str:
    return "tanh" if tanh else "none"


@runs
@pytest.mark.parametrize("tanh", FORMS)
def test_matches_torch_and_float64_over_minus_10_to_10(tanh):
    x = torch.linspace(-10, 10, 400_003)
    got = gelu_f32.gelu_(x.clone(), tanh)
    assert (got - F.gelu(x, approximate=_approximate(tanh))).abs().max().item() <= 2e-6
    want = F.gelu(x.double(), approximate=_approximate(tanh))
    assert ((got.double() - want).abs() <= 5e-7 + 1e-6 * want.abs()).all()


@runs
@pytest.mark.parametrize("tanh", FORMS)
def test_infinities_large_magnitudes_and_nan(tanh):
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e30, -1e30, 3e38, -3e38, 0.0, 20.0, -20.0, 1.0])
    got = gelu_f32.gelu_(x.clone(), tanh)
    assert got[0].item() == float("inf") and got[1].item() == 0.0 and got[2].isnan()
    assert got[3] == x[3] and got[5] == x[5]  # x itself, no overflow on the way
    assert got[4].item() == got[6].item() == got[7].item() == 0.0 and got[8].item() == 20.0
    assert abs(got[9].item()) < 1e-30 and got[10].item() == pytest.approx(F.gelu(x[10:], approximate=_approximate(
        tanh)).item(), abs=2e-7)
    assert not got[3:].isnan().any()


@runs
@pytest.mark.parametrize("tanh", FORMS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 13), (1, 8), (2, 9), (33, 1537), (129, 384)])
def test_in_place_at_odd_sizes(tanh, shape):
    torch.manual_seed(shape[1])
    x = torch.randn(*shape) * 3
    guard = torch.full((shape[0] * shape[1] + 16,), 7.0)  # the elements past the tensor stay untouched
    y = guard[: x.numel()].view(shape).copy_(x)
    out = gelu_f32.gelu_(y, tanh)
    assert out is y and y.data_ptr() == guard.data_ptr()
    assert (y - F.gelu(x, approximate=_approximate(tanh))).abs().max().item() <= 2e-6
    assert (guard[x.numel():] == 7.0).all()


@runs
def test_threads_split_a_large_tensor_the_same():
    x = torch.randn(gelu_f32.SPLIT_ELEMENTS * 3 + 5)
    bounds = gelu_f32.bounds(x.numel(), 3)
    assert len(bounds) == 4 and bounds[0] == 0 and bounds[-1] == x.numel() and all(b % 8 == 0 for b in bounds[:-1])
    split, whole = x.clone(), x.clone()
    gelu_f32.GELU(split, False, bounds)
    gelu_f32.GELU(whole, False, [0, x.numel()])
    assert torch.equal(split, whole)
    assert gelu_f32.bounds(1000, 8) == [0, 1000]


def test_other_tensors_take_torchs_gelu():
    x = torch.randn(6, 10, dtype=torch.float64)
    assert torch.equal(gelu_f32.gelu_(x.clone(), True), F.gelu(x, approximate="tanh"))
    t = torch.randn(10, 6).t()  # not contiguous
    want = F.gelu(t)
    assert torch.equal(gelu_f32.gelu_(t, False), want)


@runs
def test_the_fake_refuses_what_the_kernel_does_not_take():
    with pytest.raises(ValueError):
        gelu_f32._gelu_fake(torch.randn(4, 4).t(), False, [0, 16])
    gelu_f32._gelu_fake(torch.randn(4, 4), False, [0, 16])


def test_switch_and_missing_flags_fall_back(monkeypatch):
    monkeypatch.setenv(gelu_f32.MODE_ENV, "torch")
    gelu_f32.unavailable.cache_clear()
    try:
        assert gelu_f32.unavailable() == "POOLGATE_CPU_GELU=torch"
        monkeypatch.setenv(gelu_f32.MODE_ENV, "auto")
        gelu_f32.unavailable.cache_clear()
        monkeypatch.setattr(gelu_f32, "cpu_flags", lambda: frozenset({"avx"}))
        assert gelu_f32.unavailable() == "the CPU lacks avx2, fma"
    finally:
        gelu_f32.unavailable.cache_clear()


@onednn
@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "gelu_pytorch_tanh"])
def test_dnn_linear_runs_the_kernel_for_the_tanh_form_only(monkeypatch, activation):
    torch.manual_seed(0)
    ref = Linear(96, 160, activation=activation)
    x = torch.randn(33, 96)
    calls = []
    real = gelu_f32.gelu_
    monkeypatch.setattr(gelu_f32, "gelu_", lambda y, tanh=False: calls.append(tanh) or real(y, tanh))
    with torch.no_grad():
        want, got = ref(x), DnnLinear(ref, activation)(x)
    assert ((got - want).abs() / (1 + want.abs())).max().item() <= 1e-4
    kernel = activation != "gelu" and gelu_f32.unavailable() is None
    assert calls == ([True] if kernel else [])


@onednn
def test_dnn_linear_keeps_torchs_gelu_where_the_kernel_is_off(monkeypatch):
    monkeypatch.setattr(gelu_f32, "unavailable", lambda: "the CPU lacks avx2")
    monkeypatch.setattr(gelu_f32, "gelu_", lambda *a: pytest.fail("the kernel ran"))
    ref = Linear(16, 32, activation="gelu_new")
    x = torch.randn(5, 16)
    with torch.no_grad():
        got = DnnLinear(ref, "gelu_new")(x)
        assert ((got - ref(x)).abs() / (1 + ref(x).abs())).max().item() <= 1e-4


@onednn
def test_the_backend_reports_the_kernel_in_the_linear_line(monkeypatch):
    monkeypatch.setattr(linear_fp32, "dnn_linear_available", lambda: True)
    monkeypatch.setattr(cpu, "dnn_linear_available", lambda: True)
    monkeypatch.setattr(gelu_f32, "unavailable", lambda: None)
    assert "tanh GELU: C, AVX2+FMA" in CpuBackend().kernels(torch.float32)["linear"]
    monkeypatch.setattr(gelu_f32, "unavailable", lambda: "the CPU lacks avx2, fma")
    assert "tanh GELU: torch (the CPU lacks avx2, fma)" in CpuBackend().kernels(torch.float32)["linear"]
    monkeypatch.setenv(cpu.KERNELS_ENV, "off")
    assert CpuBackend().kernels(torch.float32)["linear"] == "torch (POOLGATE_CPU_KERNELS=off)"
