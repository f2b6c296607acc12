"""A MEAN pooler with a row selector (GritLM's instruction left out) against hand-computed means, in one batch with
plain MEAN, across runs of different params."""
from __future__ import annotations

import pytest
import torch

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.batch.packing import pack
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import RawHead
from poolgate.workers.pooling.rows import drop_ends


def test_the_kept_rows_are_averaged_per_sequence():
    seqs = [[1, 2, 3, 4], [5], [6, 7, 8], [9, 10, 11]]
    batch = pack(seqs, group_attention=False)
    hidden = torch.randn(batch.n_tokens, 6, dtype=torch.bfloat16)  # (n_tokens, hidden)
    pooler = DispatchPooler({"embed": Pooler("MEAN", RawHead(), rows=drop_ends(first=2)),
                             "classify": Pooler("MEAN", RawHead())})
    plain = PoolingParams(task="classify")
    runs = [(0, 2, PoolingParams()), (2, 3, plain), (3, 4, PoolingParams())]
    out = pooler(hidden, batch, pooler.plan(batch, runs))
    rows = hidden.float().split([len(s) for s in seqs])  # fp32 per sequence
    torch.testing.assert_close(out[0].values, torch.stack([rows[0][2:].mean(0), torch.zeros(6)]))  # none kept: 0
    torch.testing.assert_close(out[1].values, rows[2].mean(0, keepdim=True))
    torch.testing.assert_close(out[2].values, rows[3][2:].mean(0, keepdim=True))
    assert all(o.offsets is None for o in out) and out[0].values.dtype == torch.float32


@pytest.mark.parametrize("method", ["CLS", "LAST"])
def test_a_row_selector_narrows_mean_only(method):
    with pytest.raises(ValueError, match=f"a row selector narrows MEAN pooling only, not {method}"):
        DispatchPooler({"embed": Pooler(method, RawHead(), rows=drop_ends())})
