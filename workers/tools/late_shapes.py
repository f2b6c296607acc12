"""Servable random-weight ColQwen2 checkpoints of real widths, for late-interaction speed runs.

``write_colqwen2`` saves a random ``ColQwen2ForRetrieval`` with its
``ColQwen2Processor`` (a Qwen2-VL image processor and a small byte-level
tokenizer holding the special tokens the processor reads), so ``poolgate serve
DIR`` serves it and ``poolgate bench --images`` measures it; weights and the
vocabulary's size do not change the speed of what is measured (the
projection reads hidden states, never a vocabulary head). ``COLQWEN2_SHAPE``
is ColQwen2-v1.0's (Qwen2-VL-2B): give fewer layers to measure a
shape-faithful but shallower model (time grows about linearly with them).

    python -m poolgate.workers.tools.late_shapes DIR [--text-layers 28] [--vision-layers 32]
"""

from __future__ import annotations

import argparse
from pathlib import Path

WORDS = ["the", "a", "of", "is", "what", "which", "image", "describe", "question", "query", "page", "chart",
         "table", "revenue", "figure", "show", "in"]
COLQWEN2_SHAPE = {
    "hidden": 1536,
    "intermediate": 8960,
    "layers": 28,
    "heads": 12,
    "kv_heads": 2,
    "vision_dim": 1280,
    "vision_depth": 32,
    "vision_heads": 16,
    "mlp_ratio": 4,
    "max_pixels": 768 * 28 * 28,
    "dim": 128,
    "mrope": [16, 24, 24],
}


def small_vocab(specials: list[str], space: str, newline: str) -> dict[str, int]:
    """The special tokens, printable ASCII, the space and newline symbols and a few words (with and without the
    space symbol) as one vocabulary."""
    chars = [chr(c) for c in range(33, 127)] + [space, newline]
    words = [space + w for w in WORDS] + WORDS
    return {w: i for i, w in enumerate(dict.fromkeys(specials + chars + words))}


def write_colqwen2(
    folder: Path,
    *,
    hidden: int = 32,
    intermediate: int = 64,
    layers: int = 2,
    vision_dim: int = 32,
    vision_depth: int = 2,
    vision_heads: int = 4,
    mlp_ratio: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_pixels: int = 28 * 28 * 16,
    dim: int = 16,
    mrope: list[int] | None = None,
    backbone: str = "qwen2_vl",
    seed: int = 0,
) -> Path:
    """A ColQwen2ForRetrieval over a Qwen2-VL (patch 14, merge 2, temporal patch 2, as the real one; the defaults
    are a tiny one for tests) with its processor, saved in ``folder``; the widths, depths and heads as given
    (``COLQWEN2_SHAPE``: ColQwen2-v1.0's). ``backbone="qwen2_5_vl"``: the same over Qwen2.5-VL (windowed vision
    attention, its last block full), as ColQwen2.5 checkpoints are."""
    from transformers import (
        ColQwen2Config,
        ColQwen2ForRetrieval,
        ColQwen2Processor,
        Qwen2_5_VLConfig,
        Qwen2Tokenizer,
        Qwen2VLConfig,
        Qwen2VLImageProcessorPil,
    )

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
    vocab = small_vocab(specials, "Ġ", "Ċ")  # byte-level: space and newline as Ġ and Ċ
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    images = Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=max_pixels)
    processor = ColQwen2Processor(image_processor=images, tokenizer=tokenizer)
    head_dim = hidden // heads
    text = {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": len(tokenizer),
        "max_position_embeddings": 32768,
        "bos_token_id": None,
        "eos_token_id": vocab["<|im_end|>"],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": mrope or [head_dim // 8, head_dim // 8, head_dim // 4],
        },
    }
    vision = {
        "depth": vision_depth,
        "embed_dim": vision_dim,
        "hidden_size": hidden,
        "num_heads": vision_heads,
        "mlp_ratio": mlp_ratio,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    config = Qwen2VLConfig
    if backbone == "qwen2_5_vl":
        vision = {
            "depth": vision_depth,
            "hidden_size": vision_dim,
            "out_hidden_size": hidden,
            "num_heads": vision_heads,
            "intermediate_size": mlp_ratio * vision_dim,
            "window_size": 56,
            "fullatt_block_indexes": [vision_depth - 1],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        }
        config = Qwen2_5_VLConfig
    vlm = config(
        text_config=text,
        vision_config=vision,
        image_token_id=processor.image_token_id,
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
    )
    import torch

    torch.manual_seed(seed)
    model = ColQwen2ForRetrieval(ColQwen2Config(vlm_config=vlm, embedding_dim=dim)).eval()
    model.save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m poolgate.workers.tools.late_shapes",
        description="write a random ColQwen2-shaped checkpoint (module doc)",
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--text-layers", type=int, default=COLQWEN2_SHAPE["layers"])
    parser.add_argument("--vision-layers", type=int, default=COLQWEN2_SHAPE["vision_depth"])
    parser.add_argument("--max-pixels", type=int, default=COLQWEN2_SHAPE["max_pixels"])
    args = parser.parse_args(argv)
    shape = {
        **COLQWEN2_SHAPE,
        "layers": args.text_layers,
        "vision_depth": args.vision_layers,
        "max_pixels": args.max_pixels,
    }
    write_colqwen2(args.folder, **shape)
    print(f"{args.folder}: ColQwen2ForRetrieval, {shape}")


if __name__ == "__main__":
    main()
