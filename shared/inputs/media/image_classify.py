"""The ``image_classify`` plan: one image per input through a fixed-size processor, for ``*ForImageClassification``.

Settings (``workers.models.media.image_classify`` writes them at load):
``pixels``, the model's processor as ``shared.inputs.media.pixels.PixelSettings``
(ConvNeXt's ``crop_pct`` already turned into its resize and centre crop), and
``tokens``, what one image costs in the token budget (the family's formula).
Each input is one image (``shared.inputs.media.single``: text is a 400),
decoded with its guards (``shared.inputs.media.images``) and processed into
``pixel_values`` ``(3, H, W)`` float32; its sequence is ``tokens``
placeholder ids.
"""

from __future__ import annotations

import json
from typing import Any

from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.inputs.encoded import Encoded, TextEncoder
from poolgate.shared.inputs.media.images import decode_image
from poolgate.shared.inputs.media.pixels import PixelSettings, check_resize, pixel_values
from poolgate.shared.inputs.media.single import one_item_per_input, single_media
from poolgate.shared.wire.media import IMAGE, MediaItem, MediaRef, digest_of
from poolgate.shared.wire.messages import ModelInfo, PoolingCall


def pixel_settings(values: dict[str, Any]) -> PixelSettings:
    """``PixelSettings.to_dict``'s dict (lists back to tuples, as it crossed JSON)."""
    fixed: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return PixelSettings(**fixed)


class ImageClassifyPlan:
    """One image per input (module doc)."""

    def __init__(self, info: ModelInfo, encoder: TextEncoder, settings: dict[str, Any]):
        self.pixels = pixel_settings(settings["pixels"])
        self.tokens = int(settings["tokens"])
        self.key = json.dumps({"pixels": self.pixels.to_dict(), "plan": "image_classify"}, sort_keys=True)

    def encode(self, call: PoolingCall, limits: MediaLimits) -> Encoded:
        return one_item_per_input(single_media(call.inputs, IMAGE), lambda where, ref: self.item(ref, limits, where))

    def item(self, ref: MediaRef, limits: MediaLimits, where: str) -> MediaItem:
        """One image, decoded and processed."""
        image = decode_image(ref, limits, where)
        check_resize(self.pixels, image.height, image.width, limits.max_image_pixels, where)
        values = pixel_values(image.pixels, self.pixels)
        meta = {"width": image.width, "height": image.height, "format": image.format}
        return MediaItem(IMAGE, {"pixel_values": values}, digest_of(IMAGE, image.pixels, self.key), self.tokens, meta)
