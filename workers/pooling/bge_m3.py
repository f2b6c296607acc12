"""BGE-M3's three outputs from one forward: dense, sparse and multi-vector (ColBERT).

A BGE-M3 folder is an XLM-R encoder plus two small heads saved beside it,
``sparse_linear`` (hidden → 1) and ``colbert_linear`` (hidden → hidden), as
``sparse_linear.pt`` / ``colbert_linear.pt`` (pickles: loaded only with
``--allow-pickle-weights``, and then ``weights_only``) or ``.safetensors``.
Served as the architecture ``BgeM3EmbeddingModel`` (vLLM's name; ``--hf-overrides
'{"architectures": ["BgeM3EmbeddingModel"]}'``):

- ``embed``: the CLS vector, normalized;
- ``token_classify``: each token's ``relu(sparse_linear(h))`` weight, BOS and EOS dropped;
- ``token_embed``: each token's ``colbert_linear(h)``, normalized, BOS dropped.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead, RawHead
from poolgate.workers.pooling.rows import drop_ends

ARCHITECTURE = "BgeM3EmbeddingModel"


def _linear(folder: Path, name: str, *, allow_pickle: bool) -> nn.Linear:
    tensors = folder / f"{name}.safetensors"
    if tensors.is_file():
        from safetensors.torch import load_file

        state = load_file(str(tensors))
    elif (folder / f"{name}.pt").is_file():
        if not allow_pickle:
            raise PermissionError(f"{folder / name}.pt is a pickle: pass --allow-pickle-weights to load it")
        state = torch.load(folder / f"{name}.pt", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"a BGE-M3 folder needs {name}.safetensors or {name}.pt beside the encoder")
    weight = state["weight"]
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in state)
    layer.load_state_dict({k: v.float() for k, v in state.items()})
    return layer.eval()


def bge_m3_poolers(folder: Path, device: torch.device, *, allow_pickle: bool, active: str | None) -> DispatchPooler:
    sparse = nn.Sequential(_linear(folder, "sparse_linear", allow_pickle=allow_pickle), nn.ReLU()).to(device)
    colbert = _linear(folder, "colbert_linear", allow_pickle=allow_pickle).to(device)
    return DispatchPooler({
        "embed": Pooler("CLS", EmbedHead(None, True)),
        "token_embed": Pooler("ALL", EmbedHead(colbert, True), rows=drop_ends(first=1)),
        "token_classify": Pooler("ALL", RawHead(sparse), rows=drop_ends(first=1, last=1)),
    }, active=active)
