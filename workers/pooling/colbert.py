"""ColBERT in the Stanford layout (``HF_ColBERT``): each token's hidden state projected by ``linear``, L2-normalized.

colbert-ir/colbertv2.0 and answerdotai/answerai-colbert-small-v1 ship a BERT
body under ``bert.`` and the projection as ``linear.weight`` (hidden → ``dim``,
no bias), with ``architectures: ["HF_ColBERT"]`` and ``dim`` in config.json.
Served natively as vLLM serves its ColBERT model: ``token_embed`` only, one
vector per token ([CLS] and [SEP] included), scored with MaxSim on the score
routes. The ColBERT library's query markers and [MASK] expansion live in its
own tokenizer wrapper, not in the checkpoint, and are not applied here (nor
by vLLM); PyLate folders carry theirs in their sentence-transformers config.
"""
from __future__ import annotations

from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead, linear_projection
from poolgate.workers.pooling.sources import PoolerSources

PROJECTION = "linear.weight"


def colbert_poolers(src: PoolerSources) -> DispatchPooler:
    """token_embed = normalize(linear(h)) for every token h (the packed BERT body's last hidden states)."""
    linear = linear_projection(src, PROJECTION, "an HF_ColBERT", "dim")
    head = EmbedHead(linear, True, l2_cut=src.ops.l2_cut)
    return DispatchPooler({"token_embed": Pooler("ALL", head)}, active=src.spec.pooler.task,
                          out_dim=linear.out_features, ops=src.ops)
