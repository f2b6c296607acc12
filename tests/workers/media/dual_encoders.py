"""Tiny random dual encoders (CLIP, SigLIP) saved with a tokenizer and an image processor, and their reference."""
from __future__ import annotations

import io

import numpy as np
import torch

from tests.fakes import make_tiny_tokenizer

TEXT_LEN = {"clip": 20, "siglip": 16, "siglip2": 16}  # the text towers' positions (CLIP cuts to it, SigLIP pads to it)
IMAGE_SIZE, PATCH = 32, 8
MAX_PATCHES = 20  # SigLIP 2: an image is resized to at most this many patches, at its aspect ratio


def tower(**extra):
    return dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **extra)


def make_dual(folder, kind: str, *, seed: int = 0):
    """A tiny random ``CLIPModel``, ``SiglipModel`` or ``Siglip2Model`` saved (safetensors) with the word-level
    tokenizer and its ``*ImageProcessorPil`` settings into ``folder``; returns the transformers model (eval, fp32)."""
    from transformers import (
        AutoTokenizer,
        CLIPConfig,
        CLIPImageProcessorPil,
        CLIPModel,
        Siglip2Config,
        Siglip2ImageProcessorPil,
        Siglip2Model,
        SiglipConfig,
        SiglipImageProcessorPil,
        SiglipModel,
    )

    text = tower(vocab_size=100, max_position_embeddings=TEXT_LEN[kind], pad_token_id=0, bos_token_id=2,
                 eos_token_id=3)
    vision = tower(image_size=IMAGE_SIZE, patch_size=PATCH, num_channels=3)
    torch.manual_seed(seed)
    if kind == "clip":
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=24))
        processor = CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                          crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    elif kind == "siglip":
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
        processor = SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    else:  # position embeddings for a 4 x 4 grid, resized to each image's patch grid
        vision = {k: v for k, v in vision.items() if k != "image_size"} | {"num_patches": 16}
        model = Siglip2Model(Siglip2Config(text_config=text, vision_config=vision))
        processor = Siglip2ImageProcessorPil(patch_size=PATCH, max_num_patches=MAX_PATCHES)
    with torch.no_grad():  # a scale and bias that are not their init, so reading them is checked
        model.logit_scale.fill_(2.5)
        if kind != "clip":
            model.logit_bias.fill_(-3.0)
    model.eval().save_pretrained(folder, safe_serialization=True)
    make_tiny_tokenizer(folder)
    if kind == "siglip2":  # padded on the left, as Siglip2Tokenizer is by default
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        tokenizer.padding_side = "left"
        tokenizer.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model


def png(seed: int, width: int = 45, height: int = 37, fmt: str = "PNG") -> bytes:
    """A small random image's encoded bytes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, format=fmt)
    return out.getvalue()


def reference(folder, model, kind: str, texts: list[str], images: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' normalized text and image vectors from its own tokenizer and image processor's output."""
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    processor = AutoImageProcessor.from_pretrained(str(folder))
    with torch.no_grad():
        if kind == "clip":
            t = tokenizer(texts, padding=True, truncation=True, max_length=TEXT_LEN[kind], return_tensors="pt")
            text = model.get_text_features(input_ids=t["input_ids"], attention_mask=t["attention_mask"])
        else:  # as SigLIP was trained: padded to its length, every token attended
            t = tokenizer(texts, padding="max_length", truncation=True, max_length=TEXT_LEN[kind],
                          return_tensors="pt")
            text = model.get_text_features(input_ids=t["input_ids"])
        pixels = processor([Image.open(io.BytesIO(b)).convert("RGB") for b in images], return_tensors="pt")
        image = model.get_image_features(**pixels)  # SigLIP 2: with its patch mask and grid
    unit = [torch.nn.functional.normalize(x.pooler_output.float(), dim=-1).numpy() for x in (text, image)]
    return unit[0], unit[1]
