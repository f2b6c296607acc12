"""``poolgate verify`` for a Qwen2-VL / Qwen2.5-VL / Qwen3-VL embedder: probe texts and images, against transformers.

The probe texts and, as one user turn each, the synthetic probe images with
a short instruction (``shared.inputs.media.synthetic.probe_images``) run
through the model's plan and runner in the worker's engine, batched and one
per call. The reference is transformers' own base model from the folder in
float32 on what its ``Qwen2VLProcessor`` would give (that processor needs
torchvision, so its steps run as it runs them: the chat template, the image
processor from ``preprocessor_config.json``, each ``<|image_pad|>`` repeated
for its image's tokens, the tokenizer, ``mm_token_type_ids``), one input at a
time, pooled as served (the LAST token, or the mean of every token),
L2-normalized. jina-embeddings-v4's image-span mean and the jina-reranker-m0
head are named as skipped.
"""
from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch

from poolgate.shared.inputs.media.synthetic import data_url, probe_images
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.workers.engine.runner_api import LoadedModel
from poolgate.workers.tools.verify import PROBES, Check

ASK = "Describe the image."


def qwen_vl_checks(model: LoadedModel, settings: dict[str, Any], folder: str, served: Any,
                   row: Any) -> tuple[list[Check], list[str]]:
    """The embedder's text and image checks (module doc), and what is skipped."""
    import transformers

    from poolgate.workers.models.media.qwen_vl import BACKBONES

    pooler = model.runner.pooler.poolers.get("embed")
    plain = pooler is not None and not pooler.selects_rows and pooler.method in ("LAST", "MEAN")
    if settings.get("prompt") != "embed" or not plain:
        why = f"{model.info.architecture}: this pooling has no reference in verify"
        return [], [f"{task} ({why})" for task in model.info.tasks]
    reference = getattr(transformers, BACKBONES[model.info.architecture]).from_pretrained(folder, dtype=torch.float32)
    ref = _Reference(reference.eval(), folder, int(settings["image_token_id"]), pooler.method)
    texts = [t for t in PROBES if len(t) < 2000]
    images = [data for _, data in probe_images()]
    chats = [MediaInput((MediaRef("image", data_url(d)), ASK), chat=({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(d)}}, {"type": "text", "text": ASK}]},)) for d in images]
    dtype = model.info.dtype
    return [row("embed text", dtype, served(model, texts), ref.texts(texts)),
            row("embed image", dtype, served(model, chats), ref.images(images))], ["token_embed (not checked)"]


class _Reference:
    def __init__(self, model: Any, folder: str, image_token_id: int, method: str):
        from transformers import AutoImageProcessor, AutoTokenizer

        self.model, self.image_token_id, self.method = model, image_token_id, method
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.processor = AutoImageProcessor.from_pretrained(folder)
        self.pad = self.tokenizer.convert_ids_to_tokens(image_token_id)

    def _pooled(self, ids: list[int], extra: dict[str, torch.Tensor]) -> np.ndarray:
        input_ids = torch.tensor([ids])
        if extra:
            extra = {**extra, "mm_token_type_ids": (input_ids == self.image_token_id).int()}
        with torch.no_grad():
            hidden = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **extra)
        states = hidden.last_hidden_state[0]
        pooled = states[-1] if self.method == "LAST" else states.mean(0)
        return torch.nn.functional.normalize(pooled.float(), dim=-1).numpy()[None]

    def texts(self, texts: list[str]) -> np.ndarray:
        return np.concatenate([self._pooled(self.tokenizer(t)["input_ids"], {}) for t in texts])

    def images(self, images: list[bytes]) -> np.ndarray:
        from PIL import Image
        from transformers.image_transforms import convert_to_rgb

        out = []
        for data in images:
            rgb = convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True)  # alpha over white, as served
            pixels = self.processor(images=[rgb], return_tensors="pt")
            count = int(pixels["image_grid_thw"][0].prod()) // int(self.processor.merge_size) ** 2
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ASK}]}], tokenize=False)
            head, tail = text.split(self.pad, 1)
            ids = self.tokenizer(head + self.pad * count + tail)["input_ids"]
            out.append(self._pooled(ids, {"pixel_values": pixels["pixel_values"],
                                          "image_grid_thw": pixels["image_grid_thw"]}))
        return np.concatenate(out)
