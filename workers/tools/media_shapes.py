"""Servable random-weight dual encoders of real shapes (CLIP ViT-B/32, SigLIP base 224), for image speed runs.

``write_dual`` saves a random ``CLIPModel`` / ``SiglipModel`` of the shape
with the bundled MiniLM's BERT-uncased tokenizer (its 30,522 ids fit the
text towers' vocabularies; the text tower pools at its ``[SEP]``) and the
shape's image processor settings (``preprocessor_config.json``), so
``poolgate serve DIR`` serves it and ``poolgate bench --images`` measures it.
Weights do not change speed. ``poolgate bench-arch --family clip --shape
vit-b32 --write-to DIR`` calls it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from poolgate.shared.config.models import bundled_model_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
PAD, SEP = 0, 102  # the bundled BERT tokenizer's [PAD] and [SEP]
DUAL_SHAPES: dict[str, dict[str, dict]] = {  # family -> shape -> text tower, vision tower, projection, text length
    "clip": {
        "vit-b32": dict(text=dict(hidden_size=512, num_hidden_layers=12, num_attention_heads=8,
                                  intermediate_size=2048, max_position_embeddings=77, vocab_size=49408),
                        vision=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                    intermediate_size=3072, image_size=224, patch_size=32),
                        projection_dim=512, text_len=77),
        "vit-b16": dict(text=dict(hidden_size=512, num_hidden_layers=12, num_attention_heads=8,
                                  intermediate_size=2048, max_position_embeddings=77, vocab_size=49408),
                        vision=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                    intermediate_size=3072, image_size=224, patch_size=16),
                        projection_dim=512, text_len=77),
        "tiny": dict(text=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                               max_position_embeddings=77, vocab_size=30522),
                     vision=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                 image_size=32, patch_size=8),
                     projection_dim=16, text_len=77),
    },
    "siglip": {
        "base-224": dict(text=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                   intermediate_size=3072, max_position_embeddings=64, vocab_size=32000),
                         vision=dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                     intermediate_size=3072, image_size=224, patch_size=16),
                         projection_dim=None, text_len=64),
    },
}


def is_dual_shape(family: str) -> bool:
    return family in DUAL_SHAPES


def write_dual(folder: Path, family: str, shape: str, *, seed: int = 0) -> str:
    """Write the shape's folder (module doc); returns its architecture. KeyError naming the shapes there are."""
    import torch
    from transformers import (
        CLIPConfig,
        CLIPImageProcessorPil,
        CLIPModel,
        SiglipConfig,
        SiglipImageProcessorPil,
        SiglipModel,
    )

    if shape not in DUAL_SHAPES.get(family, {}):
        known = ", ".join(f"{f}/{s}" for f, sizes in DUAL_SHAPES.items() for s in sizes)
        raise KeyError(f"no dual-encoder shape {family}/{shape} (known: {known})")
    values = DUAL_SHAPES[family][shape]
    text = {**values["text"], "pad_token_id": PAD, "bos_token_id": 101, "eos_token_id": SEP}
    vision = dict(values["vision"])
    size = vision["image_size"]
    torch.manual_seed(seed)
    if family == "clip":
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=values["projection_dim"]))
        processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    else:
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
        processor = SiglipImageProcessorPil(size={"height": size, "width": size})
    folder.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    source = bundled_model_path()
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = values["text_len"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return type(model).__name__
