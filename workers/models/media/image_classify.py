"""``*ForImageClassification`` (what transformers' ``AutoModelForImageClassification`` loads), padded, on /classify.

The model is transformers' own class, loaded whole or refused
(``workers.models.media.classifier``); a batch's images (one per sequence,
``pixel_values`` made by the gateway's ``image_classify`` plan) run through
it at once and each one's logits land in its sequence's last row, pooled by
the classify head with the config's activation and labels.

The image processor is read from the folder with transformers
(``AutoImageProcessor``, the Pillow backend) and accepted only where the
gateway's fixed-size processor (``shared.inputs.media.pixels``) does the same
steps: the ViT, DeiT, BEiT, BiT, CLIP, SigLIP and ConvNeXt processors with a
plain ``size`` (height and width, or a shortest edge). ConvNeXt's
``crop_pct`` is turned into what it does: below 384 px the shortest edge is
resized to ``int(shortest_edge / crop_pct)`` then centre-cropped to
``shortest_edge`` squared; from 384 px on the image is resized to a square.
Any other processor (EfficientNet's, LeViT's, MobileViT's channel flip,
Perceiver's, PoolFormer's, dynamic-resolution ones) is refused at load with
its name.

An image's cost in the token budget (``tokens``) is the model's sequence
length where it has one: ``(H // p) * (W // p) + 1`` for a patch size ``p``
(the vision config's, for CLIP and SigLIP); for convolutional models without
a patch size it is ``ceil(H / 32) * ceil(W / 32)``, the cells of the stride-32
feature map their last stage reads.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch

from poolgate.shared.inputs.media.pixels import PixelSettings
from poolgate.workers.batch.packing import PackedBatch
from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.models.media import MediaBuilt, MediaFamily, MediaSource
from poolgate.workers.models.media.classifier import LogitsInLastRow, classify_pooler, no_text_files
from poolgate.workers.models.media.loading import load_whole
from poolgate.workers.pooling.classify import labels_of

PROCESSORS = ("ViTImageProcessor", "DeiTImageProcessor", "BeitImageProcessor", "BitImageProcessor",
              "CLIPImageProcessor", "SiglipImageProcessor", "ConvNextImageProcessor")
KNOWN_KEYS = {"do_resize", "size", "resample", "do_center_crop", "crop_size", "do_rescale", "rescale_factor",
              "do_normalize", "image_mean", "image_std", "do_convert_rgb", "crop_pct", "image_processor_type",
              "processor_class", "do_reduce_labels", "default_to_square"}
CNN_STRIDE = 32


def processor_settings(path: Any) -> tuple[str, PixelSettings]:
    """The folder's image processor: its name and ``PixelSettings`` (module doc); CheckpointError for one it cannot do."""
    from transformers import AutoImageProcessor

    where = path / "preprocessor_config.json"
    if not where.is_file():
        raise CheckpointError(path, "no preprocessor_config.json: an image classifier is served with its own "
                                    "image processor's settings")
    proc = AutoImageProcessor.from_pretrained(str(path))
    name = type(proc).__name__.removesuffix("Pil").removesuffix("Fast")
    if name not in PROCESSORS:
        raise CheckpointError(where, f"image processor {name} is not supported (poolgate processes images as "
                                     f"{', '.join(PROCESSORS)} do)")
    config = {k: v for k, v in proc.to_dict().items() if v is not None}
    odd = sorted(k for k in config if k not in KNOWN_KEYS and config[k] not in (False, None))
    if odd or config.get("do_reduce_labels"):
        raise CheckpointError(where, f"{name} with settings poolgate does not apply: {odd or ['do_reduce_labels']}")
    size = dict(config.get("size") or {})
    if set(size) - {"height", "width", "shortest_edge"} or not (set(size) in ({"height", "width"}, {"shortest_edge"})):
        raise CheckpointError(where, f"{name} size {size}: poolgate resizes to a height and width or a shortest edge")
    if name == "ConvNextImageProcessor" and config.get("do_resize", True):
        config = _convnext(config, size["shortest_edge"], float(config.get("crop_pct", 224 / 256)), where)
    elif "shortest_edge" in size and getattr(proc, "default_to_square", True):
        config["size"] = {"height": size["shortest_edge"], "width": size["shortest_edge"]}
    config["resample"] = int(config.get("resample", 3))
    return name, PixelSettings.from_config(config)


def _convnext(config: dict[str, Any], edge: int, crop_pct: float, where: Any) -> dict[str, Any]:
    """ConvNeXt's resize as a plain resize and centre crop (module doc)."""
    if config.get("do_center_crop"):
        raise CheckpointError(where, "ConvNextImageProcessor with do_center_crop: poolgate crops once, as crop_pct "
                                     "does")
    if edge < 384:
        return {**config, "size": {"shortest_edge": int(edge / crop_pct)}, "do_center_crop": True,
                "crop_size": {"height": edge, "width": edge}}
    return {**config, "size": {"height": edge, "width": edge}}


def image_tokens(hf_config: dict[str, Any], height: int, width: int) -> int:
    """An image's cost in the token budget (module doc)."""
    vision = hf_config.get("vision_config") or hf_config
    patch = vision.get("patch_size")
    if isinstance(patch, list | tuple) and len(patch) == 2:
        return (height // int(patch[0])) * (width // int(patch[1])) + 1
    if isinstance(patch, int) and patch > 0:
        return (height // patch) * (width // patch) + 1
    return math.ceil(height / CNN_STRIDE) * math.ceil(width / CNN_STRIDE)


class ImageClassifier(LogitsInLastRow):
    """A batch of images through the model at once; logits in each sequence's last row."""

    def logits(self, batch: PackedBatch) -> torch.Tensor:
        media = batch.media or []
        if len(media) != len(batch.lengths) or any(m is None or len(m) != 1 for m in media):
            raise ValueError("an image classifier reads one image per sequence")
        device, dtype = self.device_dtype()
        pixels = torch.from_numpy(np.stack([m[0].arrays["pixel_values"] for m in media]))
        inputs = {self.model.main_input_name: pixels.to(device=device, dtype=dtype)}
        return self.model(**inputs).logits  # (batch, num_labels)


def build(source: MediaSource) -> MediaBuilt:
    processor, pixels = processor_settings(source.path)
    model = load_whole(source)
    hf = json.loads(model.config.to_json_string())
    height, width = pixels.out_size(1, 1) if pixels.height or pixels.crop_height else (0, 0)
    if not height:
        raise CheckpointError(source.path / "preprocessor_config.json", "the image processor gives no fixed size "
                              "(a shortest edge without a centre crop): image classifiers read fixed-size images")
    tokens = image_tokens(hf, height, width)
    num_labels = int(model.config.num_labels)
    files = no_text_files({"plan": "image_classify", "pixels": pixels.to_dict(), "tokens": tokens})
    return MediaBuilt(model=ImageClassifier(model, num_labels), pooler=classify_pooler(source, hf), files=files,
                      modalities=("image",), embedding_dim=num_labels, max_model_len=tokens,
                      labels=labels_of(hf), extra={"processor": processor, "image size": f"{height} x {width}",
                                                   "tokens per image": tokens})


FAMILY = MediaFamily("image_classify", build, "transformers *ForImageClassification (padded), logits in the LAST row",
                     tasks=("classify",), modalities=("image",))


def architectures() -> list[str]:
    """The ``*ForImageClassification`` classes transformers' ``AutoModelForImageClassification`` maps."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES

    names: list[str] = []
    for value in MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES.values():
        names += [value] if isinstance(value, str) else list(value)
    return [n for n in names if "ForImageClassification" in n]
