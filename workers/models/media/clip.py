"""Dual encoders (CLIP, SigLIP, SigLIP 2): a text and an image tower into one space, each sequence to its tower.

transformers' own ``CLIPModel`` / ``SiglipModel`` / ``Siglip2Model`` (or one of
their one-tower models, ``TOWERS``: a text or a vision tower alone) is loaded
from the folder, whole or refused (``workers.models.media.loading.load_whole``;
``--allow-partial-weights`` serves a partial load and logs it). A batch holds
text sequences and image sequences (one image each, its ids the placeholder
tokens the gateway's plan put there: ``shared.inputs.media.clip``): the
images, stacked, go through the vision tower and its projection
(``get_image_features``), the texts, padded, through the text tower and its
projection (``get_text_features``); each sequence's vector is written into
its LAST row, which the pooler reads (then L2-normalizes, as vLLM does).
CLIP's texts run with their attention mask (its causal text tower pools the
end-of-text token); SigLIP's are padded to 64 by the plan and attend every
token, padding included, as the model was trained (``padding="max_length"``;
big_vision and open_clip use no mask there). SigLIP 2's images come as NaFlex
patches with their mask and patch grid (``shared.inputs.media.naflex``), the
arrays ``get_image_features`` reads.
The model's ``logit_scale`` (and SigLIP's ``logit_bias``) ride in the plan's
settings, for a route that reports logits (``shared.inputs.media.clip.dual_logit``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from poolgate.shared.inputs.media.pixels import PixelSettings
from poolgate.shared.inputs.words import WordSettings
from poolgate.workers.batch.packing import PackedBatch
from poolgate.workers.load.hf_tokenizer import files_of, read_tokenizer
from poolgate.workers.load.siglip_tokenizer import siglip_tokenizer
from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.models.media.loading import load_whole
from poolgate.workers.models.media import MediaBuilt, MediaFamily, MediaSource
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead

IMAGE_CHUNK = 64  # images per vision-tower forward (a batch of many images runs in slices of this many)


@dataclass(frozen=True)
class Towers:
    """How one architecture's towers are read (``DualEncoder._tower``; None: it has no such tower)."""

    kind: str  # clip, siglip, siglip2: how texts are padded and images processed
    text: str | None
    image: str | None

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(m for m, read in (("text", self.text), ("image", self.image)) if read)


TOWERS = {
    "CLIPModel": Towers("clip", "features", "features"),
    "CLIPTextModelWithProjection": Towers("clip", "text_embeds", None),
    "CLIPVisionModelWithProjection": Towers("clip", None, "image_embeds"),
    "SiglipModel": Towers("siglip", "features", "features"),
    "SiglipTextModel": Towers("siglip", "pooler_output", None),
    "SiglipVisionModel": Towers("siglip", None, "pooler_output"),
    "Siglip2Model": Towers("siglip2", "features", "features"),
    "Siglip2TextModel": Towers("siglip2", "pooler_output", None),
    "Siglip2VisionModel": Towers("siglip2", None, "pooler_output"),
}


class DualEncoder(nn.Module):
    """transformers' dual encoder over a packed batch (module doc): (n_tokens, dim), vectors in LAST rows."""

    takes_media = True
    packed_rows = False  # transformers' own forward: no token-bucket rows
    needs_groups = False

    def __init__(self, model: nn.Module, spec: Towers, *, dim: int, pad_id: int):
        super().__init__()
        self.model, self.spec = model, spec
        self.dim, self.pad_id, self.text_mask = dim, pad_id, spec.kind == "clip"

    def _tower(self, read: str | None, method: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """One tower's (k, dim) vectors: ``features`` is a dual model's ``get_*_features``, else the output field
        of a one-tower model's forward (``text_embeds``, ``image_embeds``, ``pooler_output``)."""
        if read is None:
            raise ValueError(f"{type(self.model).__name__} has no tower for this input")  # the plan refuses first
        if read == "features":
            return getattr(self.model, method)(**inputs).pooler_output
        return getattr(self.model(**inputs), read)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        n = int(batch.input_ids.shape[0])
        device = batch.input_ids.device
        dtype = next(self.model.parameters()).dtype
        media = batch.media or [None] * len(batch.lengths)
        last = (batch.cu_seqlens[1:].long() - 1).tolist()  # each sequence's LAST row
        out = torch.zeros((n, self.dim), dtype=dtype, device=device)
        images = [i for i, m in enumerate(media) if m]
        texts = [i for i, m in enumerate(media) if not m]
        if images:
            vectors = self._images([media[i][0] for i in images], device, dtype)
            out[torch.tensor([last[i] for i in images], device=device)] = vectors.to(dtype)
        if texts:
            vectors = self._texts(batch, texts)
            out[torch.tensor([last[i] for i in texts], device=device)] = vectors.to(dtype)
        return out

    def _images(self, items: list[Any], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Each image's projected vector, in order: images of one size stacked, in slices of ``IMAGE_CHUNK``."""
        out: list[torch.Tensor | None] = [None] * len(items)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for j, item in enumerate(items):
            by_shape.setdefault(tuple(item.arrays["pixel_values"].shape), []).append(j)
        for group in by_shape.values():
            for k in range(0, len(group), IMAGE_CHUNK):
                part = group[k : k + IMAGE_CHUNK]
                # pixel_values (k, 3, H, W), SigLIP 2's (k, patches, 3 * p * p) with its mask and patch grid
                arrays = {name: torch.from_numpy(np.stack([items[j].arrays[name] for j in part])).to(device)
                          for name in items[part[0]].arrays}
                arrays["pixel_values"] = arrays["pixel_values"].to(dtype)
                vectors = self._tower(self.spec.image, "get_image_features", arrays)  # (k, dim)
                for j, v in zip(part, vectors, strict=True):
                    out[j] = v
        return torch.stack(out)  # type: ignore[arg-type]

    def _texts(self, batch: PackedBatch, rows: list[int]) -> torch.Tensor:
        """The text sequences ``rows`` of the batch, padded (right) with the pad id, through the text tower."""
        device = batch.input_ids.device
        starts = batch.cu_seqlens[:-1].tolist()
        lengths = [batch.lengths[i] for i in rows]
        width = max(lengths)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long, device=device)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for r, i in enumerate(rows):
            ids[r, : lengths[r]] = batch.input_ids[starts[i] : starts[i] + lengths[r]]
            mask[r, : lengths[r]] = 1
        inputs = {"input_ids": ids, "attention_mask": mask} if self.text_mask else {"input_ids": ids}
        return self._tower(self.spec.text, "get_text_features", inputs)  # (k, dim)


def preprocessor_config(source: MediaSource) -> dict[str, Any]:
    """The folder's ``preprocessor_config.json`` (its image processor's settings); refused where it has none."""
    path = source.path / "preprocessor_config.json"
    if not path.is_file():
        raise CheckpointError(source.path, f"{source.architecture} needs its image processor's settings "
                                           "(preprocessor_config.json) beside the weights")
    return json.loads(path.read_text())


def text_settings(tokenizer: Any, text_config: Any, *, pad_to_max: bool) -> dict[str, Any]:
    """The plan's text settings: the longest text (the tokenizer's ``model_max_length`` within the text
    tower's positions), whether texts are padded to it (SigLIP) and on which side, the pad id, and the
    text tower's vocabulary (token ids sent as such are checked against it)."""
    positions = int(text_config.max_position_embeddings)
    longest = int(getattr(tokenizer, "model_max_length", positions) or positions)
    longest = positions if longest <= 0 or longest > positions else longest
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return {"max_tokens": longest, "pad_to": longest if pad_to_max else None, "pad_id": int(pad_id or 0),
            "vocab_size": int(text_config.vocab_size),
            "pad_side": "left" if getattr(tokenizer, "padding_side", "right") == "left" else "right"}


def image_settings(source: MediaSource, vision: Any, kind: str) -> dict[str, Any]:
    """The plan's image settings from ``preprocessor_config.json``: fixed-size pixels (CLIP, SigLIP; refused where
    they are not the size the vision tower reads) or SigLIP 2's NaFlex patches; the tower's tokens per image."""
    config = preprocessor_config(source)
    pixels = PixelSettings.from_config(config)
    patch = int(vision.patch_size)
    if kind == "siglip2":
        if int(config.get("patch_size", patch)) != patch:
            raise CheckpointError(source.path, f"preprocessor_config.json cuts {config['patch_size']} px patches, "
                                               f"but the vision tower reads {patch} px ones")
        most = int(config.get("max_num_patches", 256))
        return {"pixels": pixels.to_dict(), "tokens": most, "naflex": {"patch_size": patch, "max_num_patches": most}}
    size = int(vision.image_size)
    if pixels.out_size(size, size) != (size, size) or (pixels.crop_height or pixels.height or size) != size:
        raise CheckpointError(source.path, f"preprocessor_config.json makes {pixels.out_size(size, size)} images, "
                                           f"but the vision tower reads {size} x {size}")
    return {"pixels": pixels.to_dict(), "tokens": (size // patch) ** 2 + (1 if kind == "clip" else 0)}


def build_dual(source: MediaSource) -> MediaBuilt:
    """The towers ``TOWERS`` names for the folder's architecture (module doc): ``clip`` (class token, masked
    texts), ``siglip`` (no class token, texts padded to ``model_max_length`` attending every token), ``siglip2``
    (as SigLIP, NaFlex images); a one-tower model's inputs of the other kind are refused by the plan."""

    spec = TOWERS[source.architecture]
    model = load_whole(source)
    config = model.config
    text_config = getattr(config, "text_config", config) if spec.text else None
    vision = getattr(config, "vision_config", config) if spec.image else None
    if vision is not None and getattr(vision, "vision_use_head", True) is False:
        raise CheckpointError(source.path, "vision_use_head is false: this SigLIP has no pooling head to embed with")
    image = image_settings(source, vision, spec.kind) if vision is not None else None
    if text_config is not None:
        tokenizer = siglip_tokenizer(source.path) or read_tokenizer(source.path)  # SigLIP v1: its spiece.model
        text = text_settings(tokenizer, text_config, pad_to_max=spec.kind != "clip")
        files = files_of(tokenizer)
    else:  # images only: no vocabulary to read (the plan refuses texts)
        text, files = None, WordSettings().files()
    if image is not None:
        image["placeholder"] = text["pad_id"] if text else 0
    dim = int(getattr(config, "projection_dim", None) or getattr(text_config, "projection_size", None)
              or vision.hidden_size)  # CLIP: projection_dim; SigLIP: the text head's size, or the vision head's
    scale, bias = getattr(model, "logit_scale", None), getattr(model, "logit_bias", None)
    settings = {
        "plan": "clip",
        "family": source.architecture,
        "text": text,
        "image": image,
        "logit_scale": None if scale is None else float(scale.detach().float().reshape(-1)[0]),
        "logit_bias": None if bias is None else float(bias.detach().float().reshape(-1)[0]),
    }
    longest = max(text["max_tokens"] if text else 1, image["tokens"] if image else 1)
    wrapped = DualEncoder(model, spec, dim=dim, pad_id=text["pad_id"] if text else 0)
    return MediaBuilt(model=wrapped, pooler=_pooler(source), files=replace(files, media=settings),
                      modalities=spec.modalities, embedding_dim=dim, max_model_len=longest,
                      extra={"logit_scale": settings["logit_scale"], "logit_bias": settings["logit_bias"],
                             "image_tokens": image and image["tokens"], "text_tokens": text and text["max_tokens"]})


def _pooler(source: MediaSource) -> DispatchPooler:
    """embed: the LAST row (the tower's projected vector), L2-normalized unless the pooler config or the call
    says not to; a pooler config's ``dimensions`` slices it (matryoshka) as for text models."""
    pooler_config = getattr(source.settings, "pooler_config", None)
    normalize = getattr(pooler_config, "use_activation", None)
    dims = getattr(pooler_config, "dimensions", None)
    head = EmbedHead(None, True if normalize is None else bool(normalize), dims, l2_cut=source.ops.l2_cut)
    return DispatchPooler({"embed": Pooler("LAST", head)}, active=getattr(pooler_config, "task", None),
                          ops=source.ops)


def _family(architecture: str, spec: Towers) -> MediaFamily:
    towers = " and ".join(t for t, read in (("text", spec.text), ("image", spec.image)) if read)
    return MediaFamily(spec.kind, build_dual, f"transformers {architecture} (padded), {towers} tower"
                       + ("s by input" if spec.text and spec.image else ""), tasks=("embed",),
                       modalities=spec.modalities)


FAMILIES = {architecture: _family(architecture, spec) for architecture, spec in TOWERS.items()}
