"""Rows: one block of outputs, per row or ragged (offsets), sliced and joined without losing which rows are whose."""
from __future__ import annotations

import numpy as np
import pytest

from poolgate.shared.wire.rows import Rows


def test_ragged_parts_join_with_their_offsets_shifted():
    a = Rows(np.arange(6, dtype=np.float32).reshape(3, 2), np.array([0, 1, 3]))  # inputs of 1 and 2 rows
    b = Rows(np.arange(6, 10, dtype=np.float32).reshape(2, 2), np.array([0, 2]))  # one input of 2 rows
    joined = Rows.concat([a, b])
    assert joined.offsets.tolist() == [0, 1, 3, 5] and joined.offsets.dtype == np.int64
    assert len(joined) == 3
    for i, expected in enumerate([a.item(0), a.item(1), b.item(0)]):
        assert np.array_equal(joined.item(i), expected)
    assert np.array_equal(joined.slice(1, 3).item(1), b.item(0))


def test_per_row_parts_join_and_mixed_parts_are_refused():
    a, b = Rows(np.zeros((2, 3), np.float32)), Rows(np.ones((1, 3), np.float32))
    joined = Rows.concat([a, b])
    assert joined.offsets is None and len(joined) == 3 and joined.item(2).tolist() == [1, 1, 1]
    with pytest.raises(ValueError, match="per-row and ragged"):
        Rows.concat([a, Rows(np.zeros((2, 3), np.float32), np.array([0, 2]))])
