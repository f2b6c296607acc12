"""Visual late interaction (ColPali, ColQwen2, ColModernVBERT): queries are texts, documents are page images.

The plan reproduces transformers' ``ColPaliProcessor``, ``ColQwen2Processor`` and
``ColModernVBertProcessor``:

- a query (a text, or an input of text parts only) is read as
  ``query_prefix + text + query_suffix``: ColPali's ``"<bos>Question: "`` and ten
  pad tokens (its query-augmentation token) then ``"\\n"``; ColQwen2's
  ``"Query: "``, ten ``<|endoftext|>`` then ``"\\n"``;
- a page (an input of exactly one image, no text) is read as the model's visual
  prompt with the image token repeated once per image token: ColPali's
  ``"<image>" * image_seq_length + "<bos>Describe the image.\\n"`` with pixel values
  from the SigLIP processor (``shared.inputs.media.pixels``); ColQwen2's
  ``"<|im_start|>user\\n<|vision_start|>" + "<|image_pad|>" * tokens +
  "<|vision_end|>Describe the image.<|im_end|><|endoftext|>"`` with the Qwen2-VL
  patches and grid (``shared.inputs.media.qwen2_vl``), ``tokens`` set by the
  image's size; ColModernVBERT's ``"<|begin_of_text|>User:"`` + the Idefics3
  tiles' placeholder (``shared.inputs.media.idefics3``) + ``"Describe the
  image.<end_of_utterance>\\nAssistant:"``, its queries ``text`` and ten
  ``<end_of_utterance>``.

The whole string goes through the tokenizer in one call, special tokens added
as the processor adds them (``add_special_tokens``: ColPali turns its tokenizer's
BOS/EOS off and writes the BOS itself). Text and an image in one input, audio,
or more than one image are refused: these models embed one or the other. A
query longer than ``truncate_prompt_tokens`` is cut as the tokenizer cuts; a
page never is (its image tokens must all be there).

Settings (``TokenizerFiles.media``, written by ``workers.models.media.colpali``):
``plan``, ``processor`` (``siglip``, ``qwen2_vl`` or ``idefics3``), ``pixels``
(that processor's settings), ``image_token``, ``image_token_id``,
``image_tokens`` (ColPali's fixed count, ColModernVBERT's per tile; None where
the image's size decides it),
``image_before``/``image_after``, ``query_prefix``/``query_suffix``,
``add_special_tokens``, ``strip_query`` (the query's text stripped first).

ColQwen3 (``workers.models.media.colqwen3``) uses this plan with the Qwen2-VL
patches (Qwen3-VL's 16-pixel patches) and each publisher's strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.limits import cap_task, check_length, truncation_length
from poolgate.shared.domain.media_limits import check_media_count
from poolgate.shared.inputs.encoded import Encoded
from poolgate.shared.inputs.media.idefics3 import TileSettings, placeholder, tiles
from poolgate.shared.inputs.media.images import decode_image
from poolgate.shared.inputs.media.pixels import PixelSettings, check_resize, pixel_values
from poolgate.shared.inputs.media.qwen2_vl import QwenImageSettings, image_item
from poolgate.shared.wire.media import IMAGE, MediaInput, MediaItem, MediaRef, SequenceMedia, digest_of
from poolgate.shared.wire.messages import CappedText

if TYPE_CHECKING:
    from poolgate.shared.domain.media_limits import MediaLimits
    from poolgate.shared.inputs.encoded import TextEncoder
    from poolgate.shared.wire.messages import Input, ModelInfo, PoolingCall

MIXED = "reads a text (a query) or one image (a page) per input, not both"


@dataclass(frozen=True)
class Page:
    """One input read as a page: its image reference and where it is in the request."""

    ref: MediaRef
    where: str


class LateVisualPlan:
    """ColPali / ColQwen2 input shaping (module doc)."""

    def __init__(self, info: ModelInfo, encoder: TextEncoder, settings: dict[str, Any]):
        self.info, self.encoder, self.settings = info, encoder, settings
        self.processor = settings["processor"]
        if self.processor == "siglip":
            fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in settings["pixels"].items()}
            self.pixels: PixelSettings | QwenImageSettings | TileSettings = PixelSettings(**fields)
        elif self.processor == "qwen2_vl":
            self.pixels = QwenImageSettings.from_dict(settings["pixels"])
        elif self.processor == "idefics3":
            self.pixels = TileSettings.from_dict(settings["pixels"])
        else:
            raise ValueError(f"late-interaction plan: unknown image processor {self.processor!r}")
        self.image_token_id = int(settings["image_token_id"])
        self.special = bool(settings.get("add_special_tokens", True))

    def encode(self, call: PoolingCall, limits: MediaLimits) -> Encoded:
        """Each input as a query or a page (module doc), checked against the model's input cap."""
        check_media_count(call.inputs, limits)  # as the gateway and the offline API count them
        read = [self._read(i, x) for i, x in enumerate(call.inputs)]
        task = cap_task(call.params)
        k = truncation_length(self.info, call.params)
        queries = [(i, r) for i, r in enumerate(read) if isinstance(r, str)]
        ids: list[list[int]] = [[] for _ in read]
        media: list[SequenceMedia] = [None] * len(read)
        if queries:
            strip = bool(self.settings.get("strip_query"))  # TomoroAI's ColQwen3 processor strips the query
            texts = [
                self.settings["query_prefix"] + (q.strip() if strip else q) + self.settings["query_suffix"]
                for _, q in queries
            ]
            encoded = self.encoder.encode(texts, max_tokens=k, add_special_tokens=self.special)
            for (i, _), one in zip(queries, encoded, strict=True):
                ids[i] = one if k is None else one[:k]
        for i, r in enumerate(read):
            if isinstance(r, Page):
                ids[i], media[i] = self._page(r, limits, k)
        for x in ids:
            check_length(self.info, len(x), task)
        return Encoded(ids, [None] * len(ids), media=media if any(m is not None for m in media) else None)

    def _read(self, i: int, x: Input) -> str | Page:
        """A query's text or a page's image, or the 400 for what these models cannot read."""
        if isinstance(x, str):
            return x
        if isinstance(x, CappedText):
            return self.encoder.cut(x.text, x.max_tokens)
        name = self.info.served_model_name
        if isinstance(x, MediaInput):
            media = x.media
            if not media:
                return x.text
            if any(m.kind != IMAGE for m in media):
                raise InvalidRequest(f"model {name!r} reads text and images, not audio", param=f"input[{i}]")
            text = any(isinstance(p, str) and p.strip() for p in x.parts)
            if len(media) > 1 or text:
                which = f"a {x.role}" if x.role in ("query", "document") else f"input {i}"
                held = f"{len(media)} image{'s' if len(media) > 1 else ''}{' and text' if text else ''}"
                raise InvalidRequest(f"model {name!r} {MIXED}; {which} holds {held}", param=f"input[{i}]")
            return Page(media[0], f"input[{i}]")
        raise InvalidRequest(f"model {name!r} {MIXED}; input {i} is neither", param=f"input[{i}]")

    def _page(self, page: Page, limits: MediaLimits, k: int | None) -> tuple[list[int], list[MediaItem]]:
        """A page's ids (its visual prompt, the image token once per image token) and its processed image."""
        decoded = decode_image(page.ref, limits, page.where)
        meta = {"width": decoded.width, "height": decoded.height, "format": decoded.format}
        s, pixels = self.settings, self.pixels
        if isinstance(pixels, QwenImageSettings):  # ColQwen2: the image's size decides its tokens
            try:
                item = image_item(decoded.pixels, pixels, meta)
            except ValueError as exc:  # an aspect ratio or size the Qwen2-VL processor cannot resize
                raise InvalidRequest(f"{page.where}: {exc}", param=page.where) from None
            middle = s["image_token"] * item.tokens
        elif isinstance(pixels, TileSettings):  # ColModernVBERT: tiles and a global view, image_tokens each
            frames, rows, cols = tiles(decoded.pixels, pixels)
            each = int(s["image_tokens"])
            digest = digest_of(IMAGE, decoded.pixels, pixels.key())
            item = MediaItem(IMAGE, {"pixel_values": frames}, digest, each * len(frames), meta)
            middle = placeholder(rows, cols, s["image_token"], each)
        else:  # ColPali: one fixed-size image, image_tokens
            check_resize(pixels, decoded.height, decoded.width, limits.max_image_pixels, page.where)
            values = pixel_values(decoded.pixels, pixels)
            digest = digest_of(IMAGE, decoded.pixels, pixels.key())
            item = MediaItem(IMAGE, {"pixel_values": values}, digest, int(s["image_tokens"]), meta)
            middle = s["image_token"] * item.tokens
        text = s["image_before"] + middle + s["image_after"]
        ids = self.encoder.encode([text], add_special_tokens=self.special)[0]
        if sum(1 for t in ids if t == self.image_token_id) != item.tokens:
            raise ValueError(
                f"{s['image_token']!r} does not tokenize to id {self.image_token_id} once per image "
                "token (a tokenizer without the model's image token)"
            )
        if k is not None and len(ids) > k:
            raise InvalidRequest(
                f"{page.where}: a page is {len(ids)} tokens and cannot be truncated to {k} (its image tokens "
                "must all be read)",
                param="truncate_prompt_tokens",
            )
        return ids, [item]


def late_visual_plan(info: ModelInfo, encoder: TextEncoder, settings: dict[str, Any]) -> LateVisualPlan:
    return LateVisualPlan(info, encoder, settings)
