"""Servable random-weight ColQwen2 and ColQwen3 checkpoints of real widths, for late-interaction speed runs.

``write_colqwen2`` saves a random ``ColQwen2ForRetrieval`` with its
``ColQwen2Processor`` (a Qwen2-VL image processor and a small byte-level
tokenizer holding the special tokens the processor reads), so ``poolgate serve
DIR`` serves it and ``poolgate bench --images`` measures it; weights and the
vocabulary's size do not change the speed of what is measured (the
projection reads hidden states, never a vocabulary head). ``COLQWEN2_SHAPE``
is ColQwen2-v1.0's (Qwen2-VL-2B): give fewer layers to measure a
shape-faithful but shallower model (time grows about linearly with them).

    python -m poolgate.workers.tools.late_shapes DIR [--text-layers 28] [--vision-layers 32]
    python -m poolgate.workers.tools.late_shapes DIR --family colqwen3 [--text-layers 36] [--vision-layers 24]

``write_colqwen3`` writes TomoroAI's ColQwen3 layout at tomoro-colqwen3-embed-4b's
widths (``COLQWEN3_SHAPE``), served by ``workers.models.media.colqwen3``.
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


COLQWEN3_SHAPE = {  # TomoroAI's tomoro-colqwen3-embed-4b: Qwen3-VL-4B's widths, a 320-d projection
    "hidden": 2560,
    "intermediate": 9728,
    "layers": 36,
    "heads": 32,
    "kv_heads": 8,
    "vision_dim": 1024,
    "vision_depth": 24,
    "vision_heads": 16,
    "vision_intermediate": 4096,
    "dim": 320,
    "mrope": [24, 20, 20],
}


def write_colqwen3(
    folder: Path,
    *,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    vision_dim: int,
    vision_depth: int,
    vision_heads: int,
    vision_intermediate: int,
    dim: int,
    mrope: list[int],
    seed: int = 0,
) -> Path:
    """A random ColQwen3 in TomoroAI's layout (``workers.models.media.colqwen3``: a Qwen3-VL under ``vlm.``, the
    projection ``embedding_proj_layer`` with ``embed_dim``) with a Qwen2-VL-style image processor (patch 16, merge
    2) and the small byte-level tokenizer; the widths as given (``COLQWEN3_SHAPE``). Deepstack reads the first
    three vision blocks (the real model's 5, 11 and 17, when it has fewer)."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Tokenizer, Qwen2VLImageProcessorPil, Qwen3VLConfig, Qwen3VLModel

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
    vocab = small_vocab(specials, "Ġ", "Ċ")
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    text = {
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": 128, "vocab_size": len(tokenizer),
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": mrope},
    }
    deepstack = [i for i in (5, 11, 17) if i < vision_depth] if vision_depth > 17 else list(range(min(3, vision_depth)))
    vision = {
        "depth": vision_depth, "hidden_size": vision_dim, "num_heads": vision_heads,
        "intermediate_size": vision_intermediate, "out_hidden_size": hidden, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
        "deepstack_visual_indexes": deepstack,
    }
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"))}
    config = Qwen3VLConfig(text_config=text, vision_config=vision, video_token_id=ids["image_token_id"], **ids)
    torch.manual_seed(seed)
    backbone = Qwen3VLModel(config).eval()
    projection = torch.nn.Linear(hidden, dim)
    tensors = {f"vlm.model.{k}": v.contiguous() for k, v in backbone.state_dict().items()}
    tensors |= {f"embedding_proj_layer.{k}": v.detach().contiguous() for k, v in projection.state_dict().items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    saved = {**config.to_dict(), "model_type": "colqwen3", "architectures": ["ColQwen3"], "embed_dim": dim}
    (folder / "config.json").write_text(json.dumps(saved))
    tokenizer.save_pretrained(folder)
    Qwen2VLImageProcessorPil(patch_size=16, min_pixels=32 * 32 * 4, max_pixels=16384 * 32 * 32).save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m poolgate.workers.tools.late_shapes",
        description="write a random ColQwen2-shaped checkpoint (module doc)",
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--family", choices=("colqwen2", "colqwen3"), default="colqwen2",
                        help="colqwen3: TomoroAI's layout at tomoro-colqwen3-embed-4b's widths (COLQWEN3_SHAPE)")
    parser.add_argument("--text-layers", type=int, help="default: the real model's")
    parser.add_argument("--vision-layers", type=int, help="default: the real model's")
    parser.add_argument("--max-pixels", type=int, default=COLQWEN2_SHAPE["max_pixels"], help="colqwen2's processor")
    args = parser.parse_args(argv)
    if args.family == "colqwen3":
        shape = {**COLQWEN3_SHAPE, "layers": args.text_layers or COLQWEN3_SHAPE["layers"],
                 "vision_depth": args.vision_layers or COLQWEN3_SHAPE["vision_depth"]}
        write_colqwen3(args.folder, **shape)
        print(f"{args.folder}: ColQwen3 (TomoroAI's layout), {shape}")
        return
    shape = {
        **COLQWEN2_SHAPE,
        "layers": args.text_layers or COLQWEN2_SHAPE["layers"],
        "vision_depth": args.vision_layers or COLQWEN2_SHAPE["vision_depth"],
        "max_pixels": args.max_pixels,
    }
    write_colqwen2(args.folder, **shape)
    print(f"{args.folder}: ColQwen2ForRetrieval, {shape}")


if __name__ == "__main__":
    main()
