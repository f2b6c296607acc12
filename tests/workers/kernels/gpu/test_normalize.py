"""The Triton L2 normalize + matryoshka cut against its torch reference (slice, then ``F.normalize``).

The kernel sums squares in fp32 in another order than torch, so fp32 rows
match within rtol 1e-6, atol 1e-7; fp16/bf16 rows within one rounding of
their dtype (torch.testing's defaults for it). Without normalize the cut is
the same view as the reference's.
"""
import pytest
import torch
import torch.nn.functional as F

from poolgate.workers.kernels.gpu.normalize import l2_cut
from poolgate.workers.kernels.pooling import l2_cut as reference

TOL = {torch.float32: {"rtol": 1e-6, "atol": 1e-7}, torch.float16: {}, torch.bfloat16: {}}


def _rows(k: int, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(k, dim, generator=torch.Generator().manual_seed(dim)).to(dtype)


@pytest.mark.parametrize("dtype", TOL)
@pytest.mark.parametrize("dim,dimensions", [(1, None), (7, 3), (384, None), (384, 64), (1030, 1025), (1030, 1024),
                                            (16, 40)])
def test_the_cut_and_normalize_match_the_reference(dtype, dim, dimensions):
    x = _rows(5, dim, dtype)
    got, want = l2_cut(x, dimensions, True), reference(x, dimensions, True)
    assert got.dtype == dtype and got.shape == want.shape == (5, min(dim, dimensions or dim))
    torch.testing.assert_close(got, want, **TOL[dtype])
    assert torch.equal(got, l2_cut(x[:, :dimensions], None, True))  # the cut is only a narrower input


@pytest.mark.parametrize("dimensions", [None, 8])
def test_without_normalize_the_rows_are_only_cut(dimensions):
    x = _rows(3, 32)
    got = l2_cut(x, dimensions, False)
    assert torch.equal(got, reference(x, dimensions, False)) and got.shape == (3, dimensions or 32)


def test_a_zero_row_stays_zero_and_tiny_rows_divide_by_eps():
    x = torch.zeros(3, 10)
    x[1, 2] = 1e-14  # under eps: divided by 1e-12, as F.normalize does
    x[2] = 3.0
    got = l2_cut(x, None, True)
    torch.testing.assert_close(got, F.normalize(x, p=2, dim=-1), rtol=1e-6, atol=0.0)
    assert not got[0].any() and got[1, 2].item() == pytest.approx(1e-2)


def test_a_strided_input_and_no_rows():
    wide = _rows(4, 64)
    torch.testing.assert_close(l2_cut(wide[:, ::2], 20, True), reference(wide[:, ::2], 20, True), **TOL[torch.float32])
    torch.testing.assert_close(l2_cut(wide.t(), None, True), reference(wide.t(), None, True), **TOL[torch.float32])
    assert l2_cut(torch.zeros(0, 16), 8, True).shape == (0, 8)


def test_the_rows_have_unit_norm():
    got = l2_cut(_rows(6, 768) * 50.0, 256, True)
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(6), rtol=1e-6, atol=1e-6)
