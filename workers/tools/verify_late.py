"""``poolgate verify`` for visual late interaction (ColPali, ColQwen2, ColModernVBERT): token vectors vs transformers.

The probe texts as queries and the synthetic probe images as pages run
through the model's plan and runner in the worker's engine, batched and one
per call; the reference is transformers' own ``*ForRetrieval`` class from the
folder in float32 on its own processor's ``process_queries`` /
``process_images`` output (``AutoProcessor``), one input at a time, every
real token's vector. Each row of a ``Check`` is one token: the worst cosine is
over every token of every probe (``token_embed query``, ``token_embed page``).
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


def late_checks(model: LoadedModel, folder: str, served: Any, row: Any) -> list[Check]:
    """The query and page checks (module doc)."""
    import transformers
    from PIL import Image
    from transformers.image_transforms import convert_to_rgb

    reference = getattr(transformers, model.info.architecture).from_pretrained(folder, dtype=torch.float32).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    queries = [t for t in PROBES if len(t) < 200]
    images = [data for _, data in probe_images()]
    pages = [MediaInput((MediaRef("image", data_url(d)),)) for d in images]
    want_queries = np.concatenate([_tokens(reference, processor.process_queries(text=[q])) for q in queries])
    rgb = [convert_to_rgb(Image.open(io.BytesIO(d))) for d in images]  # alpha over white, as served
    want_pages = np.concatenate([_tokens(reference, processor.process_images(images=[im])) for im in rgb])
    dtype = model.info.dtype
    return [row("token_embed query", dtype, served(model, queries), want_queries),
            row("token_embed page", dtype, served(model, pages), want_pages)]


def _tokens(model: Any, batch: Any) -> np.ndarray:
    """One input's real tokens' vectors (the model zeroes the padding's)."""
    with torch.no_grad():
        out = model(**batch).embeddings[0]
    return out[batch["attention_mask"][0].bool()].float().numpy()
