"""One tokenized input waiting for, or inside, a batch (torch-free), and runs of equal params."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from poolgate.shared.domain.lanes import LIVE, Lane
from poolgate.shared.domain.params import PoolingParams


@dataclass(eq=False)
class Sequence:
    """Token ids plus the params its pooler needs; ``handle`` is the engine's (its call).

    ``token_type_ids``: the segment of each token (a BERT cross-encoder pair marks its second text
    with 1), or None when every token is segment 0 (all other inputs). ``priority`` (lower runs
    earlier), ``lane`` (bulk after every live sequence, ``shared.domain.lanes``), ``deadline`` (unix
    time, None = none) and ``arrival`` (monotonic, when its call was queued) come from its call and are
    what a batch policy (``workers.engine.policy``) orders by.
    ``attend``: per token, whether it is a key other tokens attend (False: PyLate's [MASK] query expansion
    without attention to it, ``shared.inputs.pylate_roles``), or None when every token is.
    ``prefill``: for an input run in chunks (``workers.engine.chunked_prefill.Prefill``), the whole input and
    the kept K/V of the tokens before ``token_ids`` (its current chunk); None for every other sequence.
    ``media``: the images/clips its placeholder tokens stand for (``shared.wire.media.MediaItem``, processed in
    the gateway), which a media model (``workers.models.media``) reads beside the ids; None for text."""

    token_ids: list[int]
    params: PoolingParams
    arrival: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    handle: Any = None
    token_type_ids: list[int] | None = None
    priority: int = 0
    deadline: float | None = None
    attend: list[bool] | None = None
    lane: Lane = LIVE
    prefill: Any = None
    media: list[Any] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def param_runs(seqs: list[Sequence]) -> list[tuple[int, int, PoolingParams]]:
    """Consecutive sequences with equal params, as (start, stop, params): one head call each."""
    runs, start = [], 0
    for i in range(1, len(seqs) + 1):
        if i == len(seqs) or seqs[i].params != seqs[start].params:
            runs.append((start, i, seqs[start].params))
            start = i
    return runs
