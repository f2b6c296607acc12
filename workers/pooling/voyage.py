"""voyage-4-nano (``VoyageQwen3BidirectionalEmbedModel``, vLLM's name): a bidirectional Qwen3 whose token states go
through ``linear`` (hidden → its rows, no bias), mean-pooled, L2-normalized.

voyageai/voyage-4-nano ships a Qwen3 body under ``model.`` and the projection as
``linear.weight``; vLLM serves it with ``--hf-overrides '{"architectures":
["VoyageQwen3BidirectionalEmbedModel"]}' --pooler-config '{"pooling_type": "MEAN"}'``
(its model class: Qwen3Model without the causal mask, then ``linear`` on every
token). Here the architecture name alone is enough: the body runs bidirectional
(``workers.models.decoder_config.ARCHITECTURE_SETTINGS``) and ``embed`` pools MEAN
unless ``--pooler-config`` says another pooling; the projection is linear, so
projecting the mean is projecting every token and averaging. ``token_embed`` is each
token's projection, normalized. Query / document prompts are the client's.
"""
from __future__ import annotations

from torch import nn

from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead
from poolgate.workers.pooling.sources import PoolerSources

PROJECTION = "linear.weight"
POOLING = "MEAN"


def voyage_poolers(src: PoolerSources) -> DispatchPooler:
    """embed = normalize(linear(pool(h))) (MEAN unless --pooler-config); token_embed = normalize(linear(h))."""
    if PROJECTION not in src.weights:
        raise CheckpointError(src.weights.source, f"a VoyageQwen3BidirectionalEmbedModel checkpoint needs its "
                                                  f"projection {PROJECTION}")
    weight = src.weights[PROJECTION].float()  # (dim, hidden)
    labels = src.spec.hf_config.get("num_labels")
    if labels is not None and int(labels) != weight.shape[0]:
        raise CheckpointError(src.weights.source, f"{PROJECTION} projects to {weight.shape[0]} dimensions, but "
                                                  f"config.json says num_labels={labels}")
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.load_state_dict({"weight": weight})
    linear = linear.eval().to(src.device)
    pooler = src.spec.pooler
    normalize = True if src.spec.normalize is None else src.spec.normalize
    return DispatchPooler({
        "embed": Pooler(pooler.sequence_pooling or POOLING, EmbedHead(linear, normalize, pooler.dimensions)),
        "token_embed": Pooler(pooler.token_pooling or "ALL", EmbedHead(linear, normalize)),
    }, active=pooler.task, out_dim=int(weight.shape[0]))
