"""The fp32 LayerNorm with the residual added in place (``AddInPlaceLayerNorm``) against the reference."""
import pytest
import torch

from poolgate.workers.kernels.fused_norm import FusedLayerNorm
from poolgate.workers.kernels.norm import AddInPlaceLayerNorm, LayerNorm


@pytest.mark.parametrize("cls", [AddInPlaceLayerNorm, FusedLayerNorm])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 513])
@pytest.mark.parametrize("with_residual", [True, False])
def test_equals_the_reference_bit_for_bit_and_overwrites_x_only_with_leave(cls, bias, rows, with_residual):
    torch.manual_seed(rows)
    ref, norm = LayerNorm(384, eps=1e-12, bias=bias), cls(384, eps=1e-12, bias=bias)
    w, b = torch.randn(384), torch.randn(384)
    with torch.no_grad():
        for m in (ref, norm):
            m.weight.copy_(w)
            if bias:
                m.bias.copy_(b)
    x, r = torch.randn(rows, 384) * 3, torch.randn(rows, 384) if with_residual else None
    want = ref(x, r)
    kept = x.clone()
    torch.testing.assert_close(norm(x, r), want, atol=0, rtol=0)  # no leave: x untouched
    assert torch.equal(x, kept)
    torch.testing.assert_close(norm(x, r, overwrite_x=True), want, atol=0, rtol=0)
    if with_residual:
        assert torch.equal(x, kept + r)  # the leave taken: the sum was written over x


def test_a_broadcast_or_other_dtype_runs_the_reference():
    norm = AddInPlaceLayerNorm(16, eps=1e-5)
    x = torch.randn(1, 16).expand(4, 16)  # a broadcast: not its own rows
    r = torch.randn(4, 16)
    torch.testing.assert_close(norm(x, r, overwrite_x=True), LayerNorm(16, eps=1e-5)(x, r), atol=0, rtol=0)
    xb, rb = torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(4, 16, dtype=torch.bfloat16)
    kept = xb.clone()
    norm.to(torch.bfloat16)(xb, rb, overwrite_x=True)
    assert torch.equal(xb, kept)  # bf16 is the reference's (or the C kernel's), never this path's
