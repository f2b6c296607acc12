"""Run a loaded (real) model's runner directly: prepare + execute, outputs joined into (n, dim)."""
from __future__ import annotations

import numpy as np

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.runner_api import LoadedModel
from poolgate.workers.engine.sequence import Sequence


def pool_ids(model: LoadedModel, ids: list[list[int]], params: PoolingParams = PoolingParams()) -> np.ndarray:
    """(n, dim) outputs for token-id lists, in order."""
    outputs = model.runner.execute(model.runner.prepare([Sequence(list(x), params) for x in ids]))
    assert [o.start for o in outputs] == [0, *[o.stop for o in outputs[:-1]]] and outputs[-1].stop == len(ids)
    return np.concatenate([o.rows.values for o in outputs])


def pool_texts(model: LoadedModel, texts: list[str], params: PoolingParams = PoolingParams(),
               max_tokens: int | None = None) -> tuple[np.ndarray, list[list[int]]]:
    """(n, dim) outputs for texts, and the ids they were tokenized to."""
    ids = model.encoder.encode(texts, max_tokens)
    return pool_ids(model, ids, params), ids
