"""Fallback for architectures without a packed implementation: transformers' AutoModel, padded."""
from __future__ import annotations

import torch
from torch import nn

from poolgate.workers.packing import PackedBatch
from poolgate.workers.st_config import ModelSpec


class HfAutoEncoder(nn.Module):
    """Pads the packed batch, runs AutoModel, and packs the last hidden states again."""

    def __init__(self, spec: ModelSpec, *, allow_pickle: bool):
        super().__init__()
        from transformers import AutoModel

        # a GGUF file: transformers dequantizes it (workers.gguf); else safetensors unless pickles are allowed
        source = {"gguf_file": spec.gguf_file} if spec.gguf_file else {"use_safetensors": None if allow_pickle else True}
        self.model = AutoModel.from_pretrained(str(spec.path), torch_dtype=torch.float32, **source).eval()
        self.pad_id = int(spec.hf_config.get("pad_token_id") or 0)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        n, width = len(batch.lengths), batch.max_len
        device = batch.input_ids.device
        lengths = torch.tensor(batch.lengths, device=device)
        mask = torch.arange(width, device=device)[None, :] < lengths[:, None]  # (batch, width)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long, device=device)
        ids[mask] = batch.input_ids
        kwargs = {}
        if batch.token_type_ids is not None:  # a cross-encoder's pairs: segment ids, padding as segment 0
            types = torch.zeros((n, width), dtype=torch.long, device=device)
            types[mask] = batch.token_type_ids
            kwargs["token_type_ids"] = types  # (batch, width)
        out = self.model(input_ids=ids, attention_mask=mask.long(), **kwargs).last_hidden_state  # (batch, width, hidden)
        return out[mask]  # (n_tokens, hidden), in packed order
