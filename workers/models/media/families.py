"""The media families by Hugging Face architecture name: one line per family module."""

from __future__ import annotations

from typing import Any

from poolgate.workers.models.media import MediaFamily, audio_classify, colqwen3, image_classify, qwen_vl
from poolgate.workers.models.media.clip import FAMILIES as DUAL_ENCODERS
from poolgate.workers.models.media.colpali import COLMODERNVBERT, COLPALI, COLQWEN2

MEDIA_ARCHITECTURES: dict[str, MediaFamily] = {}
# classifiers: every *ForImageClassification transformers maps, and its audio classifiers that read wav2vec2's or
# AST's features (the processor or extractor is checked at load)
MEDIA_ARCHITECTURES.update(dict.fromkeys(image_classify.architectures(), image_classify.FAMILY))
MEDIA_ARCHITECTURES.update(dict.fromkeys(audio_classify.architectures(), audio_classify.FAMILY))
MEDIA_ARCHITECTURES.update(DUAL_ENCODERS)  # CLIP, SigLIP, SigLIP 2 and their one-tower models (media.clip)
MEDIA_ARCHITECTURES["ColPaliForRetrieval"] = COLPALI  # workers.models.media.colpali
MEDIA_ARCHITECTURES["ColQwen2ForRetrieval"] = COLQWEN2
MEDIA_ARCHITECTURES["ColModernVBertForRetrieval"] = COLMODERNVBERT
MEDIA_ARCHITECTURES.update(qwen_vl.FAMILIES)  # Qwen2/2.5/3-VL embedders, jina-reranker-m0
MEDIA_ARCHITECTURES.update(colqwen3.FAMILIES)  # ColQwen3: colpali-engine / TomoroAI, OpenSearch-AI, NVIDIA


def media_family(hf_config: dict[str, Any]) -> MediaFamily | None:
    """The family of a config's first architecture, None for a text model."""
    names = hf_config.get("architectures") or []
    return MEDIA_ARCHITECTURES.get(names[0]) if names else None
