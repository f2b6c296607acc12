"""What the media classifiers share: logits in the LAST row, the classify pooler, and the tokenizer files of a
model that reads no text (their transformers class is loaded by ``workers.models.media.loading.load_whole``).

``LogitsInLastRow`` runs a family's
batch forward and puts each sequence's logits in its last row, where the
classify pooler (LAST, then ``ClassifyHead`` with no score layer of its own:
the model's head already scored) reads them; the activation is the config's
(``workers.pooling.classify.activation_for``: softmax for single-label,
sigmoid for multi-label), the labels its ``id2label``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.inputs.words import WordSettings
from poolgate.workers.batch.packing import PackedBatch
from poolgate.workers.models.media import MediaSource
from poolgate.workers.pooling.classify import ClassifyHead, activation_for, labels_of
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler



class LogitsInLastRow(nn.Module):
    """A media classifier as the runner sees it (module doc): ``logits(batch)`` is the family's."""

    takes_media = True
    packed_rows = False
    needs_groups = False

    def __init__(self, model: nn.Module, num_labels: int):
        super().__init__()
        self.model, self.num_labels = model, num_labels

    @property
    def hidden_size(self) -> int:
        return self.num_labels

    def logits(self, batch: PackedBatch) -> torch.Tensor:  # (batch, num_labels)
        raise NotImplementedError

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        logits = self.logits(batch)
        dtype = next(self.model.parameters()).dtype
        out = torch.zeros((batch.n_tokens, self.num_labels), dtype=dtype, device=logits.device)
        last = batch.cu_seqlens[1:].to(device=logits.device, dtype=torch.long) - 1
        out[last] = logits.to(dtype)
        return out

    def device_dtype(self) -> tuple[torch.device, torch.dtype]:
        p = next(self.model.parameters())
        return p.device, p.dtype


def classify_pooler(source: MediaSource, hf_config: dict[str, Any]) -> DispatchPooler:
    """The classify pooler over logits in the LAST row (module doc), with the pooler config's calibration."""
    pooler = getattr(source.settings, "pooler_config", None)
    num_labels = int(hf_config.get("num_labels") or len(hf_config.get("id2label") or {}) or 2)
    head = ClassifyHead(nn.Identity(), activation_for({**hf_config, "num_labels": num_labels}),
                        logit_mean=getattr(pooler, "logit_mean", None), logit_sigma=getattr(pooler, "logit_sigma", None),
                        use_activation=getattr(pooler, "use_activation", None))
    return DispatchPooler({"classify": Pooler("LAST", head)}, labels=labels_of(hf_config), out_dim=num_labels,
                          ops=source.ops)


def no_text_files(media: dict[str, Any]) -> TokenizerFiles:
    """Tokenizer files for a model that reads no text: the ``words`` encoder's (never used for a text: the plan
    refuses text), no chat template, the plan's ``media`` settings."""
    return dataclasses.replace(WordSettings().files(), chat_template=None, media=media)
