"""BGE-M3's three outputs from one forward: dense, sparse and multi-vector (ColBERT).

A BGE-M3 folder is an XLM-R encoder plus two small heads saved beside it,
``sparse_linear`` (hidden → 1) and ``colbert_linear`` (hidden → hidden), as
``sparse_linear.pt`` / ``colbert_linear.pt`` (pickles: loaded only with
``--allow-pickle-weights``, and then ``weights_only``; ``workers.load.checkpoint.read_file``) or ``.safetensors``.
Served as the architecture ``BgeM3EmbeddingModel`` (vLLM's name; ``--hf-overrides
'{"architectures": ["BgeM3EmbeddingModel"]}'``):

- ``embed``: the CLS vector, normalized;
- ``token_classify``: each token's ``relu(sparse_linear(h))`` weight, BOS and EOS dropped;
- ``token_embed``: each token's ``colbert_linear(h)``, normalized, BOS dropped.
"""
from __future__ import annotations

from pathlib import Path

from torch import nn

from poolgate.workers.load.checkpoint import read_file
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead, RawHead
from poolgate.workers.pooling.rows import drop_ends
from poolgate.workers.pooling.sources import PoolerSources


def _linear(folder: Path, name: str, *, allow_pickle: bool) -> nn.Linear:
    tensors, pickle = folder / f"{name}.safetensors", folder / f"{name}.pt"
    if not tensors.is_file() and not pickle.is_file():
        raise FileNotFoundError(f"a BGE-M3 folder needs {name}.safetensors or {name}.pt beside the encoder")
    state = read_file(tensors if tensors.is_file() else pickle, allow_pickle=allow_pickle)
    weight = state["weight"]
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in state)
    layer.load_state_dict({k: v.float() for k, v in state.items()})
    return layer.eval()


def bge_m3_poolers(src: PoolerSources) -> DispatchPooler:
    folder, allow_pickle = src.spec.path, src.allow_pickle
    sparse = nn.Sequential(_linear(folder, "sparse_linear", allow_pickle=allow_pickle), nn.ReLU()).to(src.device)
    colbert = _linear(folder, "colbert_linear", allow_pickle=allow_pickle).to(src.device)
    return DispatchPooler({
        "embed": Pooler("CLS", EmbedHead(None, True, l2_cut=src.ops.l2_cut)),
        "token_embed": Pooler("ALL", EmbedHead(colbert, True, l2_cut=src.ops.l2_cut), rows=drop_ends(first=1)),
        "token_classify": Pooler("ALL", RawHead(sparse), rows=drop_ends(first=1, last=1)),
    }, active=src.spec.pooler.task, ops=src.ops)
