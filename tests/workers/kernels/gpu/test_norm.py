"""The Triton LayerNorm and RMSNorm against the torch references, under the interpreter."""
import pytest
import torch

from poolgate.workers.kernels.gpu import norm as gpu_norm
from poolgate.workers.kernels.norm import LayerNorm, RMSNorm
from tests.workers.kernels.gpu.conftest import close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _layer_norms(dim, bias, dtype):
    torch.manual_seed(dim)
    ref = LayerNorm(dim, eps=1e-5, bias=bias)
    with torch.no_grad():
        ref.weight.normal_()
        if bias:
            ref.bias.normal_()
    ref = ref.to(dtype)
    tri = gpu_norm.triton_layer_norm(dim, 1e-5, bias).to(dtype)
    tri.load_state_dict(ref.state_dict())  # the same parameter names
    return ref, tri


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,bias,residual", [(64, True, True), (96, False, True), (200, True, False)])
def test_layer_norm_matches_the_reference(dtype, dim, bias, residual, launches):
    ref, tri = _layer_norms(dim, bias, dtype)
    seen = launches()["norm_rows"]
    x = (torch.randn(37, dim) * 3).to(dtype)  # an odd row count; 96 and 200: not powers of two
    r = torch.randn(37, dim).to(dtype) if residual else None
    with torch.inference_mode():
        close(tri(x, r), ref(x, r))
    assert seen.count == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_overwrite_x_writes_over_x_and_leaves_the_residual(dtype, launches):
    ref, tri = _layer_norms(128, True, dtype)
    x, r = torch.randn(21, 128).to(dtype), torch.randn(21, 128).to(dtype)
    with torch.inference_mode():
        want, r_before = ref(x, r), r.clone()
        seen = launches()["norm_rows"]
        got = tri(x, r, overwrite_x=True)
        assert seen.count == 1
        assert got.data_ptr() == x.data_ptr() and torch.equal(r, r_before)
        close(got, want)


def test_what_the_kernel_does_not_take_runs_the_reference(monkeypatch, launches):
    ref, tri = _layer_norms(64, True, torch.float32)
    seen = launches()["norm_rows"]
    x = torch.randn(6, 128)[:, ::2]  # a stride in the last dim
    with torch.inference_mode():
        assert torch.equal(tri(x, x), ref(x, x))
        y = torch.randn(2, 3, 4, 64)  # four dims
        assert torch.equal(tri(y), ref(y))
        wide = gpu_norm.triton_layer_norm(gpu_norm.MAX_DIM + 2, 1e-5)
        z = torch.randn(2, gpu_norm.MAX_DIM + 2)
        assert torch.equal(wide(z), LayerNorm(gpu_norm.MAX_DIM + 2, eps=1e-5)(z))
        z = torch.randn(5, 64)
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # a CPU tensor without the interpreter
        assert torch.equal(tri(z, z), ref(z, z))
        assert seen.count == 0
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        close(tri(z, z), ref(z, z))
        assert seen.count == 1  # and this one ran the kernel


def _rms_norms(dim, gemma, dtype):
    torch.manual_seed(dim + gemma)
    ref = RMSNorm(dim, 1e-6, gemma)
    with torch.no_grad():
        ref.weight.normal_(0.0, 0.5)
    ref = ref.to(dtype)
    tri = gpu_norm.triton_rms_norm(dim, 1e-6, gemma).to(dtype)
    tri.load_state_dict(ref.state_dict())
    return ref, tri


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("dim", [64, 160])
def test_rms_norm_matches_the_reference(dtype, gemma, dim, launches):
    ref, tri = _rms_norms(dim, gemma, dtype)
    seen = launches()["norm_rows"]
    x = (torch.randn(33, dim) * 2).to(dtype)
    with torch.inference_mode():
        close(tri(x), ref(x))
        r = torch.randn(33, dim).to(dtype)
        close(tri(x, r), ref(x + r))  # with a residual: the norm of the sum
    assert seen.count == 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_a_head_view_reads_it_in_place(dtype, launches):
    """Qwen3's q/k norm: (n, heads, head_dim) views of a fused projection, a stride between tokens."""
    ref, tri = _rms_norms(32, False, dtype)
    qkv = torch.randn(19, 7 * 32).to(dtype)
    q = qkv[:, : 4 * 32].view(19, 4, 32)
    assert not q.is_contiguous()
    seen = launches()["norm_rows"]
    with torch.inference_mode():
        close(tri(q), ref(q))
    assert seen.count == 1


def test_rms_norm_weight_in_fp32_promotes_as_the_reference(launches):
    ref, tri = _rms_norms(64, False, torch.float32)
    seen = launches()["norm_rows"]
    x = torch.randn(9, 64).to(torch.bfloat16)
    with torch.inference_mode():
        got, want = tri(x), ref(x)
    assert got.dtype == want.dtype == torch.float32 and seen.count == 1
    close(got.bfloat16(), want.bfloat16())  # x̂ rounded to bf16 before the weight: bf16's tolerance
