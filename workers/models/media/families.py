"""The media families by Hugging Face architecture name: one line per family module."""

from __future__ import annotations

from typing import Any

from poolgate.workers.models.media import MediaFamily, qwen_vl
from poolgate.workers.models.media.clip import CLIP, SIGLIP, SIGLIP2

MEDIA_ARCHITECTURES: dict[str, MediaFamily] = {}
MEDIA_ARCHITECTURES["CLIPModel"] = CLIP  # workers.models.media.clip
MEDIA_ARCHITECTURES["SiglipModel"] = SIGLIP
MEDIA_ARCHITECTURES["Siglip2Model"] = SIGLIP2
MEDIA_ARCHITECTURES.update(qwen_vl.FAMILIES)  # Qwen2/2.5/3-VL embedders, jina-reranker-m0


def media_family(hf_config: dict[str, Any]) -> MediaFamily | None:
    """The family of a config's first architecture, None for a text model."""
    names = hf_config.get("architectures") or []
    return MEDIA_ARCHITECTURES.get(names[0]) if names else None
