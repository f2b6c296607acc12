"""Packing, grouped attention and pooling methods against hand-computed torch references."""
import pytest
import torch
import torch.nn.functional as F

from poolgate.workers.kernels.attention import grouped_sdpa
from poolgate.workers.batch.packing import pack
from poolgate.workers.pooling.methods import POOLING_TYPES

LENGTHS = [5, 1, 17, 3, 17, 9, 2, 30]


def _seqs():
    return [[100 + i] * n for i, n in enumerate(LENGTHS)]


def test_pack_offsets_and_positions():
    b = pack(_seqs())
    assert b.cu_seqlens.tolist() == [0, 5, 6, 23, 26, 43, 52, 54, 84]
    assert b.positions[:7].tolist() == [0, 1, 2, 3, 4, 0, 0]
    assert b.token_type_ids is None
    assert b.seg_ids[5].item() == 1 and b.max_len == 30
    covered = sorted(t for g in b.groups for t in g.dst.tolist())
    assert covered == list(range(sum(LENGTHS)))  # every token attended exactly once


@pytest.mark.parametrize("waste,max_group", [(1.0, 1), (1.25, 32), (100.0, 64)])
def test_grouped_sdpa_matches_per_sequence(waste, max_group):
    torch.manual_seed(0)
    b = pack(_seqs(), waste=waste, max_group=max_group)
    qkv = torch.randn(b.n_tokens, 3, 4, 8)
    got = grouped_sdpa(*qkv.unbind(1), b, scale=8 ** -0.5)
    for s, e in zip(b.cu_seqlens[:-1].tolist(), b.cu_seqlens[1:].tolist()):
        q, k, v = (qkv[s:e, i].transpose(0, 1) for i in range(3))  # (heads, len, dim)
        want = F.scaled_dot_product_attention(q, k, v).transpose(0, 1)
        torch.testing.assert_close(got[s:e], want, atol=1e-5, rtol=1e-5)


def test_pooling_methods_by_hand():
    b = pack([[1, 2, 3], [4], [5, 6]])
    hidden = torch.arange(12, dtype=torch.float32).view(6, 2)  # rows: tokens
    assert POOLING_TYPES["CLS"](hidden, b).tolist() == [[0, 1], [6, 7], [8, 9]]
    assert POOLING_TYPES["LAST"](hidden, b).tolist() == [[4, 5], [6, 7], [10, 11]]
    assert POOLING_TYPES["MEAN"](hidden, b).tolist() == [[2, 3], [6, 7], [9, 10]]
