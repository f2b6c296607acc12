"""``poolgate verify`` for ColQwen3 and ColQwen3.5 (``workers.models.media.colqwen3``): token vectors vs transformers.

transformers has no ColQwen3 class, so the reference is what each publisher's
code runs, rebuilt from transformers' parts: its ``Qwen3VLModel`` /
``Qwen3_5Model`` from the folder in float32, one input at a time and
unpadded (NVIDIA's with ``is_causal`` off in every layer and a full mask, as its
code runs it), then the checkpoint's projection (OpenSearch-AI's cut to its
``dims``) and L2 normalisation. Its inputs are built apart from the plan: the
folder's tokenizer (``AutoTokenizer``) over the publisher's prompt strings, and
transformers' image processor (``AutoImageProcessor``, with TomoroAI's cap on a
page's image tokens) on the decoded probe images. The probe texts run as
queries and the synthetic probe images as pages through the model's plan and
runner in the worker's engine, batched and one per call; each row of a
``Check`` is one token (``token_embed query``, ``token_embed page``).
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from poolgate.shared.inputs.media.synthetic import data_url, probe_images
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.workers.engine.runner_api import LoadedModel
from poolgate.workers.tools.verify import PROBES, Check


def colqwen3_checks(model: LoadedModel, settings: dict[str, Any], folder: str, served: Any, row: Any) -> list[Check]:
    """The query and page checks (module doc)."""
    from PIL import Image
    from transformers.image_transforms import convert_to_rgb

    reference = _Reference(model, settings, folder)
    queries = [t for t in PROBES if len(t) < 200]
    images = [data for _, data in probe_images()]
    pages = [MediaInput((MediaRef("image", data_url(d)),)) for d in images]
    want_queries = np.concatenate([reference.query(q) for q in queries])
    rgb = [convert_to_rgb(Image.open(io.BytesIO(d)), return_numpy=True) for d in images]  # alpha over white
    want_pages = np.concatenate([reference.page(im) for im in rgb])
    dtype = model.info.dtype
    return [row("token_embed query", dtype, served(model, queries), want_queries),
            row("token_embed page", dtype, served(model, pages), want_pages)]


class _Reference:
    def __init__(self, model: LoadedModel, settings: dict[str, Any], folder: str):
        from transformers import AutoImageProcessor, AutoTokenizer

        from poolgate.workers.load.checkpoint import Checkpoint
        from poolgate.workers.models.media import MediaSource
        from poolgate.workers.models.media.colqwen3 import _backbone, _layout, _projection

        hf = json.loads((Path(folder) / "config.json").read_text())
        architecture = model.info.architecture
        source = MediaSource(Path(folder), hf, architecture, torch.float32, torch.device("cpu"), None, _Settings())
        weights = Checkpoint.open(folder)
        publisher, projection = _layout(weights, architecture)
        self.backbone = _backbone(source, weights, projection)
        self.head = None if projection is None else _projection(weights, projection)
        weights.close()
        self.dims = int(hf.get("dims") or self.head.out_features) if publisher == "opensearch" and self.head else None
        self.bidirectional = publisher == "nemotron"
        self.settings = settings
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        pixels = settings["pixels"]  # the folder's bounds, with TomoroAI's cap on a page's image tokens
        size = {"shortest_edge": int(pixels["min_pixels"]), "longest_edge": int(pixels["max_pixels"])}
        self.images = AutoImageProcessor.from_pretrained(folder, size=size)
        self.image_token_id = int(settings["image_token_id"])

    def query(self, text: str) -> np.ndarray:
        s = self.settings
        ids = self.tokenizer(s["query_prefix"] + (text.strip() if s.get("strip_query") else text) + s["query_suffix"])
        return self._tokens(ids["input_ids"], {})

    def page(self, rgb: np.ndarray) -> np.ndarray:
        s = self.settings
        pixels = self.images(images=[rgb], return_tensors="pt")
        count = int(pixels["image_grid_thw"][0].prod()) // int(self.images.merge_size) ** 2
        ids = self.tokenizer(s["image_before"] + s["image_token"] * count + s["image_after"])["input_ids"]
        return self._tokens(ids, {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"]})

    def _tokens(self, ids: list[int], extra: dict[str, torch.Tensor]) -> np.ndarray:
        input_ids = torch.tensor([ids])
        ones = torch.ones_like(input_ids)
        extra = {**extra, "mm_token_type_ids": (input_ids == self.image_token_id).int()}
        with torch.no_grad():
            if self.bidirectional:  # NVIDIA's text model: every token sees every other
                positions, _ = self.backbone.get_rope_index(input_ids, image_grid_thw=extra.get("image_grid_thw"),
                                                            attention_mask=ones,
                                                            mm_token_type_ids=extra["mm_token_type_ids"])
                for layer in self.backbone.language_model.layers:
                    layer.self_attn.is_causal = False
                full = torch.zeros((1, 1, len(ids), len(ids)))
                hidden = self.backbone(input_ids=input_ids, attention_mask=full, position_ids=positions, **extra)
            else:
                hidden = self.backbone(input_ids=input_ids, attention_mask=ones, **extra)
            states = hidden.last_hidden_state[0]
            if self.head is not None:
                states = self.head(states)
            if self.dims is not None:
                states = states[:, : self.dims]
            return torch.nn.functional.normalize(states, dim=-1).numpy()


class _Settings:
    """What the backbone loader reads of a worker's settings: the reference loads whole or not at all."""

    allow_partial_weights = False
    allow_pickle_weights = False
