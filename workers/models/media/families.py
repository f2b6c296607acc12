"""The media families by Hugging Face architecture name: one line per family module."""

from __future__ import annotations

from typing import Any

from poolgate.workers.models.media import MediaFamily
from poolgate.workers.models.media import audio_classify, image_classify
from poolgate.workers.models.media.clip import CLIP, SIGLIP, SIGLIP2

MEDIA_ARCHITECTURES: dict[str, MediaFamily] = {}
MEDIA_ARCHITECTURES["CLIPModel"] = CLIP  # workers.models.media.clip
MEDIA_ARCHITECTURES["SiglipModel"] = SIGLIP
MEDIA_ARCHITECTURES["Siglip2Model"] = SIGLIP2
# classifiers: every *ForImageClassification transformers maps, and its audio classifiers that read wav2vec2's or
# AST's features (the processor or extractor is checked at load)
MEDIA_ARCHITECTURES.update(dict.fromkeys(image_classify.architectures(), image_classify.FAMILY))
MEDIA_ARCHITECTURES.update(dict.fromkeys(audio_classify.architectures(), audio_classify.FAMILY))


def media_family(hf_config: dict[str, Any]) -> MediaFamily | None:
    """The family of a config's first architecture, None for a text model."""
    names = hf_config.get("architectures") or []
    return MEDIA_ARCHITECTURES.get(names[0]) if names else None
