"""PyLate ColBERT's poolers: every token through the folder's Dense modules, L2-normalized; documents skip the skiplist.

PyLate's ``encode`` keeps every token of a query (its [MASK] expansion too)
and drops a document's tokens whose id is in the skiplist
(``workers.load.pylate``). The row selector tells the two apart by the
marker each sequence carries after its first token (``shared.inputs.pylate_roles``
puts it there), so one run may hold queries and documents alike (a /score
call). Served task: ``token_embed``, scored with MaxSim on the score routes.
"""
from __future__ import annotations

import numpy as np
import torch

from poolgate.workers.load.pylate import PyLateSettings, read_settings
from poolgate.workers.models import architecture_for
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead, load_dense
from poolgate.workers.pooling.rows import RowSelector, per_sequence_counts
from poolgate.workers.pooling.sources import PoolerSources

PYLATE_POOLING = ("PyLate ColBERT: every token through its Dense modules, normalized; queries [Q]-marked and "
                  "[MASK]-expanded, documents [D]-marked without the skiplist; scored with MaxSim")


def skiplist_rows(settings: PyLateSettings) -> RowSelector:
    """A document's tokens (its marker at position 1) but those in the skiplist; a query's every token."""
    skip = np.fromiter(settings.skiplist, dtype=np.int64, count=len(settings.skiplist))

    def select(ids: np.ndarray, lengths: list[int]) -> tuple[np.ndarray, list[int]]:
        starts = np.cumsum([0, *lengths[:-1]], dtype=np.int64)
        marker = np.where(np.asarray(lengths) > 1, ids[np.minimum(starts + 1, len(ids) - 1)], -1)
        document = np.repeat(marker == settings.document_id, lengths)  # (run tokens,)
        keep = ~(document & np.isin(ids, skip))
        return np.flatnonzero(keep), per_sequence_counts(keep, lengths)

    return select


def pylate_poolers(src: PoolerSources) -> DispatchPooler:
    """token_embed = normalize(Dense…(h)) per token, the document skiplist dropped."""
    spec = src.spec
    settings = read_settings(spec, src.the_tokenizer("a PyLate folder's markers"))
    if settings.expand and not settings.attend_expansion and not architecture_for(spec).packed:
        raise ValueError(f"{spec.path}: PyLate's query expansion without attention to it needs a packed "
                         f"family; {spec.architecture} runs through the transformers fallback")
    dense = [load_dense(d, allow_pickle=src.allow_pickle) for d in spec.dense]
    projector = torch.nn.Sequential(*dense).to(src.device) if dense else None
    out_dim = spec.dense[-1].out_features if spec.dense else None
    head = EmbedHead(projector, True, l2_cut=src.ops.l2_cut)
    return DispatchPooler({"token_embed": Pooler("ALL", head, rows=skiplist_rows(settings))}, active="token_embed",
                          out_dim=out_dim, ops=src.ops)
