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

from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead, linear_projection
from poolgate.workers.pooling.sources import PoolerSources

PROJECTION = "linear.weight"
POOLING = "MEAN"


def voyage_poolers(src: PoolerSources) -> DispatchPooler:
    """embed = normalize(linear(pool(h))) (MEAN unless --pooler-config); token_embed = normalize(linear(h))."""
    linear = linear_projection(src, PROJECTION, "a VoyageQwen3BidirectionalEmbedModel", "num_labels")
    pooler = src.spec.pooler
    normalize = True if src.spec.normalize is None else src.spec.normalize
    return DispatchPooler({
        "embed": Pooler(pooler.sequence_pooling or POOLING, EmbedHead(linear, normalize, pooler.dimensions,
                                                                           l2_cut=src.ops.l2_cut)),
        "token_embed": Pooler(pooler.token_pooling or "ALL", EmbedHead(linear, normalize, l2_cut=src.ops.l2_cut)),
    }, active=pooler.task, out_dim=linear.out_features, ops=src.ops)
