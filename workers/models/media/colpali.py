"""Visual late interaction: ColPali, ColQwen2, ColModernVBERT through transformers' ``*ForRetrieval`` (padded).

transformers' model projects every token's last hidden state to
``embedding_dim`` (128), L2-normalises each row and zeroes the padding rows; here
each sequence is padded on the right (ColPali's positions count from 1 whatever
the padding, Qwen2-VL's come from the attention mask, ModernBERT attends both
ways under the mask, so a sequence's rows do not depend on its batch) and only
its own rows come back, one per token.
The served task is ``token_embed`` (pooling ALL: the page's image tokens and
prompt, the query's text and its augmentation tokens), scored with MaxSim on
the score routes; there is no single-vector ``embed`` (these models have none:
a mean of the token vectors is not what they were trained for).

The processor (transformers' ``ColPaliProcessor`` / ``ColQwen2Processor`` /
``ColModernVBertProcessor``, read
from the folder) gives the gateway's plan its strings and image settings
(``shared.inputs.media.colpali``); its tokenizer (the image token and, for
ColPali, the location tokens added as the processor adds them) is the one the
gateway tokenizes with.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from poolgate.shared.inputs.media.idefics3 import TileSettings
from poolgate.shared.inputs.media.pixels import PixelSettings
from poolgate.shared.inputs.media.qwen2_vl import QwenImageSettings
from poolgate.workers.batch.packing import PackedBatch, pack, padded_ids, to_device
from poolgate.workers.load.hf_tokenizer import files_of
from poolgate.workers.models.media.loading import load_whole
from poolgate.workers.models.media import MediaBuilt, MediaFamily, MediaSource
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead

log = logging.getLogger("poolgate.worker")


class LateVisualModel(nn.Module):
    """transformers' ColPali / ColQwen2 over a packed batch: padded on the right, one row per real token."""

    takes_media = True
    packed_rows = False
    needs_groups = False

    def __init__(self, model: nn.Module, pad_id: int, kind: str):
        super().__init__()
        self.model, self.pad_id, self.kind = model, pad_id, kind

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        ids, mask = padded_ids(batch, self.pad_id)  # (batch, width) each
        device = ids.device
        items = [m for seq in (batch.media or []) if seq is not None for m in seq]  # in sequence order
        kwargs: dict[str, Any] = {}
        if items and self.kind == "colqwen2":  # the processor's layout: each image's patches padded, and the grids
            patches = [torch.tensor(m.arrays["pixel_values"]) for m in items]  # (the wire's arrays are read-only)
            padded = nn.utils.rnn.pad_sequence(patches, batch_first=True)  # (images, max patches, C*T*P*P)
            kwargs["pixel_values"] = padded.to(device)
            kwargs["image_grid_thw"] = torch.from_numpy(np.concatenate([m.arrays["image_grid_thw"] for m in items]))
            kwargs["image_grid_thw"] = kwargs["image_grid_thw"].to(device)
        elif items and self.kind == "colmodernvbert":  # per image its frames, padded with all-zero frames (skipped)
            frames = [torch.tensor(m.arrays["pixel_values"]) for m in items]  # (frames, 3, tile, tile) each
            padded = nn.utils.rnn.pad_sequence(frames, batch_first=True)  # (images, max frames, 3, tile, tile)
            real = torch.arange(padded.shape[1])[None, :] < torch.tensor([len(f) for f in frames])[:, None]
            pixel_mask = real[:, :, None, None].expand(-1, -1, *padded.shape[-2:]).long()  # 0: a padding frame
            kwargs["pixel_values"], kwargs["pixel_attention_mask"] = padded.to(device), pixel_mask.to(device)
        elif items:
            kwargs["pixel_values"] = torch.from_numpy(np.stack([m.arrays["pixel_values"] for m in items])).to(device)
        if self.kind == "colpali":  # its processor always sends them, all 0 (no suffix): the prefix attends both ways
            kwargs["token_type_ids"] = torch.zeros_like(ids)  # (PaliGemma's mask is causal without them when padded)
        out = self.model(input_ids=ids, attention_mask=mask.long(), **kwargs).embeddings  # (batch, width, dim)
        return out[mask]  # (n_tokens, dim), in packed order


def _augmentation(processor: Any) -> str:
    """The query suffix: the processor's query-augmentation token ten times, then the newline it ends with."""
    return processor.query_augmentation_token * 10 + "\n"


def colpali_settings(processor: Any) -> dict[str, Any]:
    """What the gateway's plan reads (``shared.inputs.media.colpali``) of a ``ColPaliProcessor``."""
    bos = processor.tokenizer.bos_token
    pixels = PixelSettings.from_config(processor.image_processor.to_dict())
    return {"plan": "colpali", "processor": "siglip", "pixels": pixels.to_dict(),
            "image_token": processor.image_token, "image_token_id": int(processor.image_token_id),
            "image_tokens": int(processor.image_seq_length), "image_before": "",
            "image_after": f"{bos}{processor.visual_prompt_prefix}\n",
            "query_prefix": f"{bos}{processor.query_prefix}", "query_suffix": _augmentation(processor),
            "add_special_tokens": False}


def colqwen2_settings(processor: Any) -> dict[str, Any]:
    """What the gateway's plan reads of a ``ColQwen2Processor``: its visual prompt cut at its one image token."""
    token = processor.image_token
    before, sep, after = processor.visual_prompt_prefix.partition(token)
    if not sep:
        raise ValueError(f"the ColQwen2 visual prompt {processor.visual_prompt_prefix!r} holds no {token!r}")
    pixels = QwenImageSettings.from_config(processor.image_processor.to_dict())
    return {"plan": "colqwen2", "processor": "qwen2_vl", "pixels": pixels.to_dict(), "image_token": token,
            "image_token_id": int(processor.image_token_id), "image_tokens": None, "image_before": before,
            "image_after": after, "query_prefix": processor.query_prefix, "query_suffix": _augmentation(processor),
            "add_special_tokens": True}


def colmodernvbert_settings(processor: Any) -> dict[str, Any]:
    """What the gateway's plan reads of a ``ColModernVBertProcessor``: its visual prompt cut at its image token,
    the Idefics3 tiles and the image tokens per tile; queries without a newline after the augmentation."""
    token = processor.image_token
    before, sep, after = processor.visual_prompt_prefix.partition(token)
    if not sep:
        raise ValueError(f"the ColModernVBERT visual prompt {processor.visual_prompt_prefix!r} holds no {token!r}")
    pixels = TileSettings.from_config(processor.image_processor.to_dict())
    return {"plan": "colmodernvbert", "processor": "idefics3", "pixels": pixels.to_dict(), "image_token": token,
            "image_token_id": int(processor.image_token_id), "image_tokens": int(processor.image_seq_len),
            "image_before": before, "image_after": after, "query_prefix": processor.query_prefix,
            "query_suffix": processor.query_augmentation_token * 10, "add_special_tokens": True}


SETTINGS = {"colpali": colpali_settings, "colqwen2": colqwen2_settings, "colmodernvbert": colmodernvbert_settings}


def _warm_up(files: Any, architecture: str, max_len: int, dim: int) -> Any:
    """A warm-up that runs a query and a synthetic page (``shared.inputs.media.synthetic``), laid out by the
    gateway's own plan, through the runner's model once: kernels are chosen before the first request."""

    def warm_up(runner: Any) -> None:
        from poolgate.shared.domain.media_limits import MediaLimits
        from poolgate.shared.domain.params import PoolingParams
        from poolgate.shared.inputs.encoders import encoder_for
        from poolgate.shared.inputs.media.colpali import LateVisualPlan
        from poolgate.shared.inputs.media.synthetic import probe_images
        from poolgate.shared.wire.media import MediaInput, MediaRef
        from poolgate.shared.wire.messages import ModelInfo, PoolingCall

        info = ModelInfo("warm-up", architecture, ("token_embed",), max_len, dim, "", "")
        plan = LateVisualPlan(info, encoder_for(files), files.media)
        params = PoolingParams(task="token_embed")
        page = MediaInput((MediaRef("image", data=probe_images()[0][1]),))
        encoded = plan.encode(PoolingCall("warm-up", "warm-up", ["warm up", page], params), MediaLimits())
        batch = pack(encoded.ids, group_attention=False)
        batch.media = encoded.media
        log.info("warming up: a query and a page (%d tokens)", len(encoded.ids[1]))
        with torch.inference_mode():
            runner.model(to_device(batch, runner.backend.device()))

    return warm_up


def _build(source: MediaSource, kind: str) -> MediaBuilt:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(source.path))
    settings = SETTINGS[kind](processor)
    model = load_whole(source)
    text = model.config.vlm_config.get_text_config()
    pad = processor.tokenizer.pad_token_id
    files = replace(files_of(processor.tokenizer), media=settings)
    head = EmbedHead(None, True, l2_cut=source.ops.l2_cut)  # rows come normalised; normalising again keeps them
    pooler = DispatchPooler({"token_embed": Pooler("ALL", head)}, active="token_embed", ops=source.ops)
    dim, max_len = int(model.config.embedding_dim), int(text.max_position_embeddings)
    return MediaBuilt(model=LateVisualModel(model, int(pad or 0), kind), pooler=pooler, files=files,
                      modalities=("text", "image"), embedding_dim=dim, max_model_len=max_len,
                      warm_up=_warm_up(files, source.architecture, max_len, dim),
                      extra={"query_prefix": settings["query_prefix"], "image_tokens": settings["image_tokens"]})


def build_colpali(source: MediaSource) -> MediaBuilt:
    return _build(source, "colpali")


def build_colqwen2(source: MediaSource) -> MediaBuilt:
    return _build(source, "colqwen2")


def build_colmodernvbert(source: MediaSource) -> MediaBuilt:
    return _build(source, "colmodernvbert")


COLPALI = MediaFamily("colpali", build_colpali, "transformers ColPaliForRetrieval (padded), a vector per token",
                      tasks=("token_embed",), modalities=("text", "image"))
COLQWEN2 = MediaFamily("colqwen2", build_colqwen2, "transformers ColQwen2ForRetrieval (padded), a vector per token",
                       tasks=("token_embed",), modalities=("text", "image"))
COLMODERNVBERT = MediaFamily("colmodernvbert", build_colmodernvbert, "transformers ColModernVBertForRetrieval "
                             "(padded), a vector per token", tasks=("token_embed",), modalities=("text", "image"))
