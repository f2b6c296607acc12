"""The media families by Hugging Face architecture name: one line per family module."""

from __future__ import annotations

from typing import Any

from poolgate.workers.models.media import MediaFamily, qwen_vl

MEDIA_ARCHITECTURES: dict[str, MediaFamily] = {
    **{name: qwen_vl.family(name) for name in qwen_vl.BACKBONES},  # Qwen2-VL / Qwen3-VL embedders, jina-reranker-m0
}


def media_family(hf_config: dict[str, Any]) -> MediaFamily | None:
    """The family of a config's first architecture, None for a text model."""
    names = hf_config.get("architectures") or []
    return MEDIA_ARCHITECTURES.get(names[0]) if names else None
