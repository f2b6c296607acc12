"""Tiny random ColPali, ColQwen2 and ColModernVBERT checkpoints with their processors, and test images, for the late-interaction tests.

Each folder holds what a published checkpoint holds: transformers' model saved
whole (safetensors), and its processor (the tokenizer with the special tokens
the processor needs, and the image processor's settings). The tokenizers are
built here from a small vocabulary (transformers' Gemma and Qwen2 tokenizer
classes over it, with the special tokens each processor reads), so the tests need no download.
"""
from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import torch

from poolgate.workers.tools.late_shapes import small_vocab as _vocab
from poolgate.workers.tools.late_shapes import write_colqwen2 as colqwen2_folder

__all__ = ["colqwen2_folder"]  # the ColQwen2 builder is the servable one (workers.tools.late_shapes)


def colpali_folder(folder: Path, *, image_size: int = 28, patch: int = 14, seed: int = 0) -> Path:
    """A ColPaliForRetrieval over a 2-layer PaliGemma (SigLIP 2 layers, Gemma 2 layers, hidden 32), dim 16."""
    from transformers import (ColPaliConfig, ColPaliForRetrieval, ColPaliProcessor, GemmaTokenizer,
                              PaliGemmaConfig, SiglipImageProcessorPil)

    tokenizer = GemmaTokenizer(vocab=_vocab(["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"], "▁", "\n"), merges=[])
    images = SiglipImageProcessorPil(size={"height": image_size, "width": image_size})
    images.image_seq_length = (image_size // patch) ** 2
    processor = ColPaliProcessor(image_processor=images, tokenizer=tokenizer)
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, image_size=image_size, patch_size=patch, projection_dim=32)
    text = dict(model_type="gemma", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, vocab_size=len(tokenizer), max_position_embeddings=512)
    vlm = PaliGemmaConfig(vision_config=vision, text_config=text, image_token_id=processor.image_token_id,
                          projection_dim=32)
    torch.manual_seed(seed)
    model = ColPaliForRetrieval(ColPaliConfig(vlm_config=vlm, embedding_dim=16)).eval()
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    return folder


def colmodernvbert_folder(folder: Path, *, tile: int = 56, longest_edge: int = 112, seed: int = 0) -> Path:
    """A ColModernVBertForRetrieval over a small ModernVBERT (SigLIP 2 layers on 56 px tiles, patch 14, pixel
    shuffle 2: 4 tokens a tile; ModernBERT 3 layers with local and global attention), Idefics3 tiles, dim 16."""
    from transformers import (ColModernVBertConfig, ColModernVBertForRetrieval, ColModernVBertProcessor,
                              Idefics3ImageProcessorPil, ModernVBertConfig, Qwen2Tokenizer)

    grid = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    specials = ["<|endoftext|>", "<|begin_of_text|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>",
                "<global-img>", *grid]
    vocab = _vocab(specials, "Ġ", "Ċ")
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token="<|begin_of_text|>",
                               eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    images = Idefics3ImageProcessorPil(size={"longest_edge": longest_edge}, max_image_size={"longest_edge": tile})
    processor = ColModernVBertProcessor(image_processor=images, tokenizer=tokenizer, image_seq_len=4)
    text = dict(model_type="modernbert", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, vocab_size=len(tokenizer), max_position_embeddings=512, local_attention=16,
                global_attn_every_n_layers=2, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                eos_token_id=None, cls_token_id=None, sep_token_id=None)
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, image_size=tile, patch_size=14)
    vlm = ModernVBertConfig(text_config=text, vision_config=vision, image_token_id=processor.image_token_id,
                            pixel_shuffle_factor=2)
    torch.manual_seed(seed)
    model = ColModernVBertForRetrieval(ColModernVBertConfig(vlm_config=vlm, embedding_dim=16)).eval()
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    return folder


def sample_image(height: int, width: int, seed: int = 0):
    """A PIL image of smooth colour ramps and noise (resampling does something to it)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) % 256], -1)
    pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def data_url(image) -> str:
    """The image as a PNG ``data:`` URL (lossless: the server decodes the same pixels)."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
