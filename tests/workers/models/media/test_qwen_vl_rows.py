"""The Qwen-VL rows layout: first-fit into rows as wide as the longest sequence, positions restarting per sequence."""
import random

import torch

from poolgate.workers.models.media.qwen_vl_rows import lay_out, packed_inputs


def test_rows_never_outnumber_the_sequences_and_never_overlap():
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 40))]
        rows = lay_out(lengths)
        assert rows.width == max(lengths) and rows.count <= len(lengths)
        taken = [set() for _ in range(rows.count)]
        for r, s, n in zip(rows.row, rows.start, lengths):
            span = set(range(s, s + n))
            assert s + n <= rows.width and not taken[r] & span
            taken[r] |= span
    assert lay_out([758, 12, 30, 7, 5]).count == 2  # a page, and four short texts in one row: two rows, not five


def test_packed_inputs_restart_text_positions_and_keep_each_sequences_tokens():
    lengths = [5, 2, 3]
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 0, 0, 0], [8, 9, 10, 0, 0]])
    mask = ids != 0
    rope = torch.arange(5).expand(3, 3, 5).clone()
    rows = lay_out(lengths)
    packed, positions, order = packed_inputs(ids, mask, lengths, rope, 0, rows)
    assert rows.count == 2 and positions.shape == (4, 2, 5)
    flat = packed.reshape(-1)[rows.token_index(lengths)]
    assert flat.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # the batch's packed order back
    assert positions[0, 1].tolist() == [0, 1, 2, 0, 1]  # the second row: a 3-token and a 2-token sequence
    assert order == [0, 2, 1]  # images come row by row, as their tokens do
