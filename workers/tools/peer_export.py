"""A sentence-transformers folder as the CPU peers run it: its ONNX export, tokenizer, truncation and pooling.

``load_folder`` opens the folder with sentence-transformers (so the tokenizer,
``max_seq_length`` and the pooling are the ones the baseline uses) and exports
its transformer with torch.onnx's exporter (``dynamo=True``; the older
TorchScript exporter bakes transformers' mask shapes into the graph and gives
wrong vectors for padded batches): int64 inputs as the tokenizer names them,
batch and sequence axes dynamic, the last hidden state out. The pooling (mean,
CLS or max over the attention mask) and the normalization the folder's
modules ask for are done after the session, in numpy (``pool``).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

POOLINGS = ("mean", "cls", "max")


@dataclass
class Folder:
    """What a peer needs of the model folder: the exported graph, the tokenizer and the pooling after it."""

    path: str
    onnx_path: Path
    tokenizer: Any
    input_names: tuple[str, ...]
    max_seq_length: int
    pooling: str  # one of POOLINGS
    normalize: bool


def _pooling_of(model: Any) -> tuple[str, bool]:
    """The folder's pooling mode and whether it normalizes, from its sentence-transformers modules."""
    modes = [m.pooling_mode for m in model if type(m).__name__ == "Pooling"]
    if len(modes) != 1 or modes[0] not in POOLINGS:
        raise ValueError(f"the peers pool by one of {POOLINGS}; this folder's pooling is {modes}")
    names = [type(m).__name__ for m in model]
    if names[-1] not in ("Pooling", "Normalize"):
        raise ValueError(f"the peers run transformer, pooling and normalize only; this folder has {names}")
    return modes[0], "Normalize" in names


_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the exported graph's inputs, in this order


def _hidden_module(auto_model: Any) -> Any:
    """The transformer returning the last hidden state alone (what gets exported)."""
    import torch

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = auto_model

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
        ) -> torch.Tensor:
            extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state

    return Hidden().eval()


def load_folder(path: str, out_dir: Path) -> Folder:
    """Open ``path`` with sentence-transformers and export its transformer to ``out_dir/model.onnx``."""
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(path, device="cpu")
    st.to(torch.float32)
    pooling, normalize = _pooling_of(st)
    tokenizer = st.tokenizer
    example = tokenizer(
        ["an example input for the export", "a shorter one"], padding=True, return_tensors="pt"
    )  # two rows of unequal length, so neither axis is specialized
    if unknown := set(example) - set(_INPUTS):
        raise ValueError(f"the peers feed {_INPUTS}; this tokenizer also gives {sorted(unknown)}")
    input_names = tuple(k for k in _INPUTS if k in example)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=max(int(st.max_seq_length), 16))
    onnx_path = out_dir / "model.onnx"
    with contextlib.redirect_stdout(sys.stderr):  # the exporter's progress lines; stdout is the bench's report
        program = torch.onnx.export(
            _hidden_module(st[0].auto_model),
            tuple(example[k] for k in input_names),
            dynamo=True,
            input_names=list(input_names),
            output_names=["last_hidden_state"],
            dynamic_shapes={k: {0: batch, 1: seq} for k in input_names},
            external_data=False,
            verbose=False,
        )
    program.save(str(onnx_path))
    return Folder(path, onnx_path, tokenizer, input_names, int(st.max_seq_length), pooling, normalize)


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str, normalize: bool) -> np.ndarray:
    """(batch, seq, dim) hidden states to (batch, dim) float32 vectors under the attention mask."""
    hidden = hidden.astype(np.float32, copy=False)
    if mode == "cls":
        out = hidden[:, 0]
    elif mode == "max":
        out = np.where(mask[..., None] > 0, hidden, -np.inf).max(axis=1)
    else:
        m = mask[..., None].astype(np.float32)
        out = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    if normalize:
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(out, dtype=np.float32)
