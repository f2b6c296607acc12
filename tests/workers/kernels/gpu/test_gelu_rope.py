"""The Triton linear epilogue (bias + activation) and RoPE against the torch references, under the interpreter."""
import pytest
import torch
from torch import nn

from poolgate.workers.kernels.gpu.gelu import TritonLinear, triton_linear
from poolgate.workers.kernels.gpu.rope import triton_rope
from poolgate.workers.kernels.linear import Linear
from poolgate.workers.kernels.rope import apply_rope
from tests.workers.kernels.gpu.conftest import close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_epilogue_matches_the_reference(dtype, activation, bias, launches):
    seen = launches()["bias_act"]
    torch.manual_seed(len(activation))
    ref = Linear(64, 96, bias=bias, activation=activation).to(dtype)
    tri = triton_linear(64, 96, bias, activation).to(dtype)
    tri.load_state_dict(ref.state_dict())  # the same parameter names
    x = (torch.randn(23, 64) * 2).to(dtype)
    with torch.inference_mode():
        close(tri(x), ref(x))
    assert seen.count == 1


def test_the_linear_is_the_reference_linear_to_lora_and_checkpoints():
    tri = triton_linear(16, 8, True, "gelu")
    assert isinstance(tri, Linear) and isinstance(tri, nn.Linear) and tri.activation == "gelu"
    assert set(tri.state_dict()) == {"weight", "bias"}
    plain = triton_linear(16, 8, True)
    x = torch.randn(5, 16)
    with torch.inference_mode():  # no activation: F.linear with its bias, the reference to the bit
        assert torch.equal(plain(x), torch.nn.functional.linear(x, plain.weight, plain.bias))


def test_the_epilogue_runs_in_place_over_the_matmul(monkeypatch):
    """One kernel over the GEMM's output: the result is that buffer (no second allocation)."""
    tri = TritonLinear(32, 48, activation="silu")
    seen = []
    real = torch.nn.functional.linear

    def linear(x, w, b=None):
        out = real(x, w, b)
        seen.append((b, out))
        return out

    monkeypatch.setattr(torch.nn.functional, "linear", linear)
    with torch.inference_mode():
        y = tri(torch.randn(7, 32))
    assert len(seen) == 1 and seen[0][0] is None and y.data_ptr() == seen[0][1].data_ptr()


def _cos_sin(n, rot, seed=0):
    torch.manual_seed(seed)
    angles = torch.arange(n)[:, None] * torch.rand(rot // 2)[None, :] * 3
    angles = torch.cat([angles, angles], dim=-1)[:, None, :]  # (n, 1, rot), the halves repeated as HF makes them
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,head_dim,rot", [(4, 64, 64), (3, 80, 40), (5, 64, 16)])  # full, partial
def test_rope_matches_the_reference(dtype, heads, head_dim, rot, launches):
    seen = launches()["rope"]
    cos, sin = _cos_sin(29, rot)
    x = torch.randn(29, heads, head_dim).to(dtype)
    with torch.inference_mode():
        close(triton_rope(x, cos, sin), apply_rope(x, cos, sin))
    assert seen.count == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_of_a_head_view_and_cos_without_repeated_halves(dtype, launches):
    """k as the decoder passes it: a (n, kv_heads, d) view of the fused qkv output; cos/sin halves that differ."""
    qkv = torch.randn(17, (4 + 2 + 2) * 32).to(dtype)
    k = qkv[:, 4 * 32: 6 * 32].view(17, 2, 32)
    assert not k.is_contiguous()
    cos, sin = torch.randn(17, 1, 32), torch.randn(17, 1, 32)
    seen = launches()["rope"]
    with torch.inference_mode():
        got = triton_rope(k, cos, sin)
        close(got, apply_rope(k, cos, sin))
    assert got.is_contiguous() and seen.count == 1


def test_rope_the_kernel_does_not_take_runs_the_reference(monkeypatch, launches):
    seen = launches()["rope"]
    x, (cos, sin) = torch.randn(6, 2, 64), _cos_sin(6, 64)
    odd = torch.randn(6, 1, 63)
    assert torch.equal(triton_rope(x, odd, odd), apply_rope(x, odd, odd))  # an odd rotary dim
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert torch.equal(triton_rope(x, cos, sin), apply_rope(x, cos, sin))
    assert seen.count == 0
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    close(triton_rope(x, cos, sin), apply_rope(x, cos, sin))
    assert seen.count == 1
