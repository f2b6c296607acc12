"""The dual encoders' plan (CLIP, SigLIP, SigLIP 2): each input is a text or one image, for its tower.

The worker's family (``workers.models.media.clip``) sends its settings in
``TokenizerFiles.media``: ``text`` (``max_tokens``, the longest text;
``pad_to`` and ``pad_side``, how SigLIP's texts are padded as it was trained;
``pad_id``; ``vocab_size``, the bound of token ids sent as such) and ``image``
(``pixels``: the processor's ``PixelSettings``;
``tokens``: the vision tower's tokens, patches plus CLIP's class token;
``placeholder``: the id that fills an image's sequence; ``naflex``: SigLIP 2's
``patch_size`` and ``max_num_patches``, its images cut into patches at their
own aspect ratio by ``shared.inputs.media.naflex``), either None for a tower
the model lacks; ``logit_scale`` and ``logit_bias`` (None for CLIP), which
``dual_logit`` applies to a cosine. A text is tokenized with the model's
tokenizer, always cut to ``max_tokens`` (the text tower has no more
positions; ``truncate_prompt_tokens`` cuts shorter); an image is decoded
(``images.decode_image``, under the call's ``MediaLimits``) and processed
(``pixels.pixel_values``) into a ``MediaItem`` whose sequence is ``tokens``
placeholder ids: its cost in the token budget. An input of text and an image
together is a 400, as vLLM answers: the towers embed one or the other.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.limits import check_length, truncation_length
from poolgate.shared.inputs.encoded import Encoded
from poolgate.shared.inputs.media.images import decode_image
from poolgate.shared.inputs.media.naflex import naflex_arrays
from poolgate.shared.inputs.media.pixels import PixelSettings, check_resize, pixel_values
from poolgate.shared.wire.media import IMAGE, MediaInput, MediaItem, SequenceMedia, digest_of
from poolgate.shared.wire.messages import CappedText

if TYPE_CHECKING:
    from poolgate.shared.domain.media_limits import MediaLimits
    from poolgate.shared.inputs.encoded import TextEncoder
    from poolgate.shared.wire.messages import ModelInfo, PoolingCall


def pixel_settings(settings: dict[str, Any]) -> PixelSettings:
    """``PixelSettings.to_dict`` read back (JSON made its tuples lists)."""
    values = dict(settings)
    for key in ("mean", "std"):
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    return PixelSettings(**values)


def dual_logit(settings: dict[str, Any], cosine: float) -> float:
    """The model's logit for a text-image cosine: ``exp(logit_scale) * cosine (+ logit_bias)``, as
    ``CLIPModel``/``SiglipModel`` compute ``logits_per_text`` (SigLIP's sigmoid of it is the match probability)."""
    scale, bias = settings.get("logit_scale"), settings.get("logit_bias")
    if scale is None:  # a one-tower model (CLIPVisionModelWithProjection, ...) has no logit scale
        raise ValueError(f"{settings.get('family')} has no logit scale: its scores are cosines only")
    return math.exp(float(scale)) * cosine + (float(bias) if bias is not None else 0.0)


def dual_scores(
    settings: dict[str, Any], cosines: np.ndarray, pair_query: list[int], use_activation: bool
) -> np.ndarray:
    """A dual encoder's scores when a request asks for more than cosines (``use_activation`` on /score and
    /rerank): False gives the model's logits (``dual_logit``, transformers' ``logits_per_text``); True its
    trained activation of them: SigLIP's sigmoid (a pair's match probability), CLIP's softmax over each query's
    documents in the request (its zero-shot probabilities). 400 for a model with no logit scale."""
    scale, bias = settings.get("logit_scale"), settings.get("logit_bias")
    if scale is None:
        raise InvalidRequest(
            f"use_activation: this {settings.get('family')} model has no logit scale, so its scores are cosines "
            "only; send the request without use_activation",
            param="use_activation",
        )
    logits = np.float32(math.exp(float(scale))) * cosines.astype(np.float32)
    if bias is not None:
        logits = logits + np.float32(bias)
    if not use_activation:
        return logits
    if bias is not None:  # SigLIP: trained with a pairwise sigmoid loss
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    out = np.empty_like(logits)  # CLIP: a softmax over the documents each query is scored against
    owners = np.asarray(pair_query)
    for q in np.unique(owners):
        mine = owners == q
        shifted = np.exp(logits[mine] - logits[mine].max())
        out[mine] = shifted / shifted.sum()
    return out


class DualEncoderPlan:
    """Texts for the text tower, one image per input for the image tower (module doc)."""

    def __init__(self, info: ModelInfo, encoder: TextEncoder, settings: dict[str, Any]):
        self.info, self.encoder = info, encoder
        self.text: dict[str, Any] | None = settings.get("text")
        image = settings.get("image")
        self.image: dict[str, Any] | None = image
        self.pixels = pixel_settings(image["pixels"]) if image else None
        self.key = self.pixels.key() if self.pixels is not None else ""

    def encode(self, call: PoolingCall, limits: MediaLimits) -> Encoded:
        """Each input as its tower's ids, an image with its ``MediaItem`` (module doc); 400s name the input."""
        ids: list[list[int] | None] = [None] * len(call.inputs)
        media: list[SequenceMedia] = [None] * len(call.inputs)
        texts: list[tuple[int, str]] = []
        images = 0
        for i, x in enumerate(call.inputs):
            where = f"input[{i}]"
            if isinstance(x, MediaInput) and x.media:
                images += len(x.media)
                if images > limits.max_images_per_request:
                    raise InvalidRequest(
                        f"the request holds more than {limits.max_images_per_request} images "
                        "(--max-images-per-request)",
                        param="input",
                    )
                ids[i], media[i] = self._image(x, where, limits)
            elif isinstance(x, list):  # token ids, sent as they are (SigLIP's padded to its length)
                ids[i] = self._text_ids(list(x), where)
            elif isinstance(x, CappedText):  # a bi-encoder score's query or document under its token cap
                texts.append((i, self.encoder.cut(x.text, x.max_tokens)))
            elif isinstance(x, (str, MediaInput)):
                texts.append((i, x if isinstance(x, str) else x.text))
            else:
                raise InvalidRequest(
                    f"{where}: {self._name} embeds a text or an image per input, not a {type(x).__name__}",
                    param="input",
                )
        if texts:
            for (i, _), row in zip(texts, self._encode_texts([t for _, t in texts], call), strict=True):
                ids[i] = row
        out = [x for x in ids if x is not None]
        assert len(out) == len(ids)
        for x in out:
            check_length(self.info, len(x))
        return Encoded(out, [None] * len(out), media=media if images else None)

    @property
    def _name(self) -> str:
        return f"model {self.info.served_model_name!r}"

    def _encode_texts(self, texts: list[str], call: PoolingCall) -> list[list[int]]:
        if self.text is None:
            raise InvalidRequest(f"{self._name} embeds images only; an input holds text", param="input")
        longest = int(self.text["max_tokens"])
        k = truncation_length(self.info, call.params)
        keep = longest if k is None else min(k, longest)
        rows = self.encoder.encode(texts, max_tokens=keep, add_special_tokens=call.params.add_special_tokens)
        rows = [x[:keep] for x in rows]  # a cap under the tokenizer's special tokens keeps the cap
        return [self._padded(x) for x in rows]

    def _text_ids(self, ids: list[int], where: str) -> list[int]:
        if self.text is None:
            raise InvalidRequest(f"{self._name} embeds images only; {where} holds token ids", param="input")
        vocab = self.text.get("vocab_size")
        if vocab is not None and ids and max(ids) >= int(vocab):
            raise InvalidRequest(
                f"{where}: token id {max(ids)} is out of vocabulary (the text tower has {vocab} tokens)",
                param="input",
            )
        if len(ids) > int(self.text["max_tokens"]):
            raise InvalidRequest(
                f"{where}: {len(ids)} token ids, over the text tower's {self.text['max_tokens']} positions",
                param="input",
            )
        return self._padded(ids)

    def _padded(self, ids: list[int]) -> list[int]:
        """SigLIP's texts padded to the length it was trained at (``pad_to``); others as they are."""
        assert self.text is not None
        pad_to = self.text.get("pad_to")
        if not pad_to or len(ids) >= pad_to:
            return ids
        pad = [int(self.text["pad_id"])] * (pad_to - len(ids))
        return pad + ids if self.text.get("pad_side") == "left" else ids + pad

    def _image(self, x: MediaInput, where: str, limits: MediaLimits) -> tuple[list[int], list[MediaItem]]:
        if x.text.strip() or len(x.media) > 1:
            raise InvalidRequest(
                f"{where}: {self._name} accepts text-only or image-only inputs (one image each); this input holds "
                + ("text and an image" if x.text.strip() else f"{len(x.media)} images"),
                param="input",
            )
        ref = x.media[0]
        if ref.kind != IMAGE:
            raise InvalidRequest(f"{where}: {self._name} reads text and images, not {ref.kind}", param="input")
        if self.image is None or self.pixels is None:
            raise InvalidRequest(f"{where}: {self._name} embeds text only; this input holds an image", param="input")
        image = decode_image(ref, limits, where)
        naflex = self.image.get("naflex")
        if naflex:  # SigLIP 2: patches at the image's own aspect ratio (shared.inputs.media.naflex)
            arrays = naflex_arrays(image.pixels, self.pixels, int(naflex["patch_size"]), int(naflex["max_num_patches"]))
        else:
            check_resize(self.pixels, image.height, image.width, limits.max_image_pixels, where)
            arrays = {"pixel_values": pixel_values(image.pixels, self.pixels)}
        tokens = int(self.image["tokens"])
        item = MediaItem(
            IMAGE,
            arrays,
            digest_of(IMAGE, image.pixels, self.key),
            tokens,
            {"width": image.width, "height": image.height, "format": image.format},
        )
        return [int(self.image["placeholder"])] * tokens, [item]
