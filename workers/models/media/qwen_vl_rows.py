"""A Qwen-VL batch laid out as rows of several sequences each: text and image tokens together, no padding between.

transformers' Qwen2-VL, Qwen2.5-VL and Qwen3-VL language models take
four-row position ids (the text positions, then M-RoPE's temporal, height and
width rows) with no attention mask as a packed batch: a new sequence starts
wherever the text position does not step by one, and each attends only
within itself (causally). ``lay_out`` packs the batch's sequences first-fit,
longest first, into rows as wide as its longest sequence, so a batch never
has more rows, nor wider ones, than the padded batch it replaces, and short
texts beside a page's image tokens share its row instead of each padding to
its width. The M-RoPE positions are transformers' own (``get_rope_index`` over
the padded batch, each sequence's part moved to its place); the images are
reordered as their tokens now come (row by row), which is the order the model
scatters their features in. ``Rows.gather`` puts the rows' hidden states back
in the batch's packed order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Rows:
    """Where each sequence sits: ``row[i]``, ``start[i]`` of sequence ``i``; ``width`` the rows' length."""

    row: list[int]
    start: list[int]
    count: int
    width: int

    def token_index(self, lengths: list[int]) -> torch.Tensor:
        """(n_tokens,) flat index into the (rows * width) block of every token, in the batch's packed order."""
        parts = [torch.arange(n) + r * self.width + s for r, s, n in zip(self.row, self.start, lengths)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def lay_out(lengths: list[int]) -> Rows:
    """First-fit decreasing into rows as wide as the longest sequence (module doc)."""
    width = max(lengths)
    free: list[int] = []  # each row's free tokens
    row, start = [0] * len(lengths), [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        r = next((k for k, room in enumerate(free) if room >= lengths[i]), None)
        if r is None:
            r = len(free)
            free.append(width)
        row[i], start[i] = r, width - free[r]
        free[r] -= lengths[i]
    return Rows(row, start, len(free), width)


def packed_inputs(ids: torch.Tensor, mask: torch.Tensor, lengths: list[int], positions: torch.Tensor, pad_id: int,
                  rows: Rows) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The (rows, width) ids, the (4, rows, width) position ids, and the order of the sequences' images.

    ``ids``/``mask``: the padded (batch, width) block; ``positions``: its (3, batch, width) M-RoPE positions.
    A row's free tail holds pad ids at text positions counting from 0: a sequence of its own, whose states
    are never read."""
    n_rows, width = rows.count, rows.width
    out = torch.full((n_rows, width), pad_id, dtype=ids.dtype, device=ids.device)
    text = torch.zeros((n_rows, width), dtype=positions.dtype, device=ids.device)
    rope = torch.zeros((3, n_rows, width), dtype=positions.dtype, device=ids.device)
    used = [0] * n_rows
    for i, n in enumerate(lengths):
        r, s = rows.row[i], rows.start[i]
        out[r, s : s + n] = ids[i, :n]
        text[r, s : s + n] = torch.arange(n, device=ids.device)
        rope[:, r, s : s + n] = positions[:, i, :n]
        used[r] = max(used[r], s + n)
    for r, end in enumerate(used):  # the free tail: its own sequence from position 0
        text[r, end:] = torch.arange(width - end, device=ids.device)
    order = sorted(range(len(lengths)), key=lambda i: (rows.row[i], rows.start[i]))
    return out, torch.cat([text[None], rope]), order


def block_mask(rows: Rows, lengths: list[int], dtype: torch.dtype) -> torch.Tensor:
    """(rows, 1, width, width) additive mask for bidirectional attention over the packed rows: 0 where query
    and key belong to one sequence, the dtype's minimum elsewhere; a row's free tail is a sequence of its own
    (its states are never read, and no query row is all masked)."""
    segment = torch.full((rows.count, rows.width), -1, dtype=torch.long)
    for i, n in enumerate(lengths):
        segment[rows.row[i], rows.start[i] : rows.start[i] + n] = i
    same = segment[:, :, None] == segment[:, None, :]
    mask = torch.zeros(same.shape, dtype=dtype)
    return mask.masked_fill_(~same, torch.finfo(dtype).min)[:, None]


def image_order(media: list | None, order: list[int]) -> list:
    """The batch's image items in the order their tokens come in the rows."""
    if not media:
        return []
    return [m for i in order if media[i] for m in media[i]]


def rope_positions(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, grids: torch.Tensor | None,
                   image_token_id: int) -> torch.Tensor:
    """(3, batch, width) M-RoPE positions of the padded batch: transformers' own for a batch with images, the text
    positions in each of the three rows for one without."""
    if grids is None:
        text = (torch.cumsum(mask.long(), dim=1) - 1).clamp(min=0)
        return text[None].expand(3, -1, -1)
    positions, _ = model.get_rope_index(ids, image_grid_thw=grids, attention_mask=mask.long(),
                                        mm_token_type_ids=(ids == image_token_id).int())
    return positions


def grids_of(items: list) -> np.ndarray | None:
    return np.concatenate([m.arrays["image_grid_thw"] for m in items]) if items else None
