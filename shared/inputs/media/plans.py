"""The media plans by name (``TokenizerFiles.media["plan"]``): one line per plan module; ``plan_for``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from poolgate.shared.inputs.media import qwen_vl
from poolgate.shared.inputs.media.audio_classify import AudioClassifyPlan
from poolgate.shared.inputs.media.base import MediaPlan, PlanFactory
from poolgate.shared.inputs.media.clip import DualEncoderPlan
from poolgate.shared.inputs.media.colpali import late_visual_plan
from poolgate.shared.inputs.media.image_classify import ImageClassifyPlan

if TYPE_CHECKING:
    from poolgate.shared.inputs.encoded import TextEncoder
    from poolgate.shared.wire.messages import ModelInfo

PLANS: dict[str, PlanFactory] = {}
PLANS["clip"] = DualEncoderPlan  # CLIP, SigLIP (shared.inputs.media.clip)
PLANS["colpali"] = PLANS["colqwen2"] = PLANS["colmodernvbert"] = late_visual_plan  # shared.inputs.media.colpali
PLANS["colqwen3"] = late_visual_plan  # ColQwen3's publishers' prompts (workers.models.media.colqwen3)
PLANS[qwen_vl.PLAN] = qwen_vl.make_plan  # Qwen2-VL / Qwen3-VL embedders, jina-reranker-m0
PLANS["image_classify"] = ImageClassifyPlan  # *ForImageClassification (shared.inputs.media.image_classify)
PLANS["audio_classify"] = AudioClassifyPlan  # wav2vec2-style and AST audio classifiers


def plan_for(info: ModelInfo, encoder: TextEncoder) -> MediaPlan | None:
    """The plan the encoder's files name (None for a text model); ValueError for a plan this gateway lacks."""
    settings = getattr(encoder.files, "media", None)
    if not settings:
        return None
    make = PLANS.get(settings.get("plan", ""))
    if make is None:
        raise ValueError(f"media plan {settings.get('plan')!r}: this gateway has {sorted(PLANS)}")
    return make(info, encoder, settings)
