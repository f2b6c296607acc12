"""Tiny random Qwen2-VL / Qwen3-VL checkpoints with a word-level tokenizer, chat template and image processor, and
transformers' own forward over its processor's output (the reference the media family is checked against)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import transformers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>", "[UNK]"]
WORDS = ["user", "assistant", "system", "Document", "Query", "**", "**:", "a", "photo", "of"]
IMAGE_TOKEN, START, END = 5, 3, 4
# a Qwen2-VL-like template: image parts become the vision placeholder
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}"
    "{% for c in m.content %}{% if c.type == 'image' or 'image_url' in c %}<|vision_start|><|image_pad|>"
    "<|vision_end|>{% elif c.type == 'text' %}{{ c.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GENERATORS = {
    "qwen2_vl": transformers.Qwen2VLForConditionalGeneration,
    "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
    "qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
}
PIXELS = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 12}


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + WORDS + [f"w{i}" for i in range(200 - len(SPECIALS) - len(WORDS))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS[:7])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=TEMPLATE)


def config(kind: str, architecture: str | None = None, **extra):
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

    text = dict(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=64, bos_token_id=0, eos_token_id=2,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0})
    ids = dict(image_token_id=IMAGE_TOKEN, video_token_id=6, vision_start_token_id=START, vision_end_token_id=END)
    if kind == "qwen3_vl":
        vision = dict(depth=2, hidden_size=32, num_heads=4, intermediate_size=64, out_hidden_size=32, patch_size=16,
                      spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                      deepstack_visual_indexes=[0])
        return Qwen3VLConfig(text_config={**text, "head_dim": 8}, vision_config=vision, **ids, **extra,
                             architectures=[architecture or "Qwen3VLForConditionalGeneration"])
    if kind == "qwen2_5_vl":
        vision = dict(depth=2, hidden_size=32, num_heads=4, intermediate_size=64, out_hidden_size=32, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids, **extra,
                                architectures=[architecture or "Qwen2_5_VLForConditionalGeneration"])
    vision = dict(depth=2, embed_dim=32, num_heads=4, mlp_ratio=2, hidden_size=32, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)
    return Qwen2VLConfig(text_config=text, vision_config=vision, **ids, **extra,
                         architectures=[architecture or "Qwen2VLForConditionalGeneration"])


def make(folder: Path, kind: str = "qwen2_vl", *, architecture: str | None = None, seed: int = 0, **extra):
    """Saves a random ``*ForConditionalGeneration`` (its config naming ``architecture``), the tokenizer and the
    image processor into ``folder``; returns transformers' (image processor, tokenizer) and base model (eval)."""
    import transformers

    torch.manual_seed(seed)
    cfg = config(kind, architecture, **extra)
    gen = GENERATORS[kind](cfg).eval()
    with torch.no_grad():  # larger than the init's 0.02, so images and positions move the vectors visibly
        for p in gen.parameters():
            p.mul_(5.0) if p.dim() > 1 else None
    gen.save_pretrained(folder, safe_serialization=True)
    config_path = Path(folder) / "config.json"
    saved = json.loads(config_path.read_text())
    saved["architectures"] = [architecture or type(gen).__name__]
    config_path.write_text(json.dumps(saved))
    tok = tokenizer()
    tok.save_pretrained(folder)
    pixels = {**PIXELS, **({"patch_size": 16} if kind == "qwen3_vl" else {})}
    images = transformers.Qwen2VLImageProcessorPil(**pixels)
    images.save_pretrained(folder)
    return (images, tok), gen.model


def image(seed: int, height: int, width: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def reference_hidden(processor, model, text: str, images: list[np.ndarray], suffix: tuple[int, ...] = ()):
    """transformers' last hidden states (tokens, hidden) and ids for one input. Its ``Qwen2VLProcessor`` cannot
    be built here (it wants a video processor, which needs torchvision), so its steps are run as it runs them:
    transformers' image processor, each ``<|image_pad|>`` in the text repeated for its image's tokens, the
    tokenizer, ``mm_token_type_ids`` 1 on image tokens."""
    images_proc, tok = processor
    kwargs = {}
    if images:
        out = images_proc(images=list(images), return_tensors="pt")
        merge = images_proc.merge_size**2
        pieces = text.split("<|image_pad|>")
        assert len(pieces) == len(images) + 1
        counts = [int(g.prod()) // merge for g in out["image_grid_thw"]]
        text = pieces[0] + "".join("<|image_pad|>" * n + rest for n, rest in zip(counts, pieces[1:], strict=True))
        kwargs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    ids = tok(text, add_special_tokens=True)["input_ids"] + list(suffix)
    input_ids = torch.tensor([ids])
    if images:
        kwargs["mm_token_type_ids"] = (input_ids == IMAGE_TOKEN).int()
    with torch.no_grad():
        hidden = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs).last_hidden_state
    return hidden[0], ids
