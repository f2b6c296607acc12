"""The Qwen2-VL / Qwen3-VL input plan (torch-free): texts, chats and image parts to ids with expanded image pads.

Each image stands in its sequence as ``<|vision_start|><|image_pad|><|vision_end|>``
(what the model's chat template writes for an image part), and its one pad
becomes as many pad tokens as the image's patches make tokens
(``shared.inputs.media.qwen2_vl``), as transformers' ``Qwen2VLProcessor``
expands it; those tokens are the image's cost in the token budget. How an
input becomes text:

- a string: tokenized as it is (no template), as vLLM embeds a prompt;
- token ids: as given (they may hold no image pads: no image goes with them);
- a ``ChatInput``, or a ``MediaInput`` that came as chat messages: rendered with
  the model's chat template, its image parts in place;
- a ``MediaInput`` of bare parts (Cohere's ``images``/``inputs``, a score
  document): one user message of those parts through the chat template, or,
  for a model without one, the parts joined, each image as its placeholder;
- for the jina-reranker-m0 prompt (``prompt: "jina_rerank"``), a pair: a
  ``TextPair`` (query, document) or a ``MediaInput`` with ``role="pair"`` whose
  LAST part is the query and the parts before it the document; its text is
  ``**Document**:\\n{document}\\n**Query**:\\n{query}`` with the score token appended;
- for Qwen3-VL-Reranker (``prompt: "qwen3_vl_rerank"``), the same pairs in vLLM's
  ``qwen3_vl_reranker.jinja`` prompt (``qwen3_vl_rerank``: its system turn, the
  instruction (``instruction`` on ``/score`` and ``/rerank``, else its default), the
  query and the document, a document's parts joined by newlines).

An input holding images is never truncated (a cut could split an image): one
longer than the asked truncation is a 400, as one longer than the model is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.limits import cap_task, check_length, truncation_length
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.inputs.encoded import Encoded, TextEncoder
from poolgate.shared.inputs.media.images import decode_image
from poolgate.shared.inputs.media.qwen2_vl import QwenImageSettings, image_item
from poolgate.shared.inputs.score_templates import qwen3_vl_rerank
from poolgate.shared.wire.media import IMAGE, MediaInput, MediaItem, MediaRef
from poolgate.shared.wire.messages import ChatInput, Input, ModelInfo, PoolingCall, TextPair

PLAN = "qwen_vl"
JINA_RERANK = "jina_rerank"
QWEN3_VL_RERANK = "qwen3_vl_rerank"  # the prompt: shared.inputs.score_templates.qwen3_vl_rerank
NO_INSTRUCTION = "takes no instruction (its prompt has no place for one)"


@dataclass(frozen=True)
class Shaped:
    """One input before tokenizing: its text (image placeholders in place) and its images in order, or ids."""

    text: str | None
    images: list[MediaRef]
    ids: list[int] | None = None
    suffix: tuple[int, ...] = ()  # ids appended after tokenizing (jina-reranker-m0's score token)


class QwenVLPlan:
    """``MediaPlan`` for Qwen2-VL-style models (module doc). ``settings``: ``image`` (``QwenImageSettings`` as a
    dict), ``image_token_id``, ``placeholder`` (the image's text), ``prompt`` (``embed`` or ``jina_rerank``),
    ``score_token_id`` (the reranker's)."""

    renders_chats = True  # a chat's options (add_generation_prompt, ...) apply: the template renders it

    def __init__(self, info: ModelInfo, encoder: TextEncoder, settings: dict[str, Any]):
        self.info, self.encoder = info, encoder
        self.image = QwenImageSettings.from_dict(settings["image"])
        self.pad_id = int(settings["image_token_id"])
        self.placeholder = str(settings["placeholder"])
        self.prompt = settings.get("prompt", "embed")
        self.score_token_id = settings.get("score_token_id")

    def encode(self, call: PoolingCall, limits: MediaLimits) -> Encoded:
        shaped = [self._shape(x, i) for i, x in enumerate(call.inputs)]
        count = sum(len(s.images) for s in shaped)
        if count > limits.max_images_per_request:
            raise InvalidRequest(
                f"the request holds {count} images; this server takes at most {limits.max_images_per_request} "
                "(--max-images-per-request)",
                param="input",
            )
        k = truncation_length(self.info, call.params)
        params = call.params
        ids: list[list[int]] = []
        media: list[list[MediaItem] | None] = []
        for i, s in enumerate(shaped):
            items = [self._item(ref, limits, f"input[{i}]") for ref in s.images]
            one = self._ids(s, items, i, k, params.add_special_tokens, params.truncation_side)
            ids.append(one)
            media.append(items or None)
        task = cap_task(params)
        for x in ids:
            check_length(self.info, len(x), task)
        return Encoded(ids, [None] * len(ids), media=media)

    def _item(self, ref: MediaRef, limits: MediaLimits, where: str) -> MediaItem:
        if ref.kind != IMAGE:
            name = self.info.served_model_name
            raise InvalidRequest(f"{where}: model {name!r} reads text and images, not {ref.kind}", param="input")
        decoded = decode_image(ref, limits, where)
        try:
            return image_item(decoded.pixels, self.image, {"format": decoded.format})
        except ValueError as exc:  # an aspect ratio past 200:1
            raise InvalidRequest(f"{where}: {exc}", param="input") from None

    def _ids(self, s: Shaped, items: list[MediaItem], i: int, k: int | None, special: bool, side: str) -> list[int]:
        """The input's ids with each image pad expanded to its image's tokens (module doc)."""
        if s.ids is not None:
            raw = list(s.ids)
        elif not s.images and not s.suffix:
            assert s.text is not None
            return self.encoder.encode([s.text], max_tokens=k, add_special_tokens=special, side=side)[0]
        else:
            assert s.text is not None
            raw = self.encoder.encode([s.text], add_special_tokens=special)[0] + list(s.suffix)
        pads = [j for j, t in enumerate(raw) if t == self.pad_id]
        if len(pads) != len(items):
            raise InvalidRequest(
                f"input[{i}] holds {len(items)} images but its text places {len(pads)} image tokens", param="input"
            )
        out: list[int] = []
        start = 0
        for j, item in zip(pads, items, strict=True):
            out += raw[start:j] + [self.pad_id] * item.tokens
            start = j + 1
        out += raw[start:]
        if k is not None and len(out) > k:
            if items:
                raise InvalidRequest(
                    f"input[{i}] is {len(out)} tokens with its images, more than the {k} asked; an input with "
                    "images is not truncated",
                    param="truncate_prompt_tokens",
                )
            out = out[-k:] if side == "left" else out[:k]
        if items and len(out) > self.info.max_model_len:  # never split into chunks: an image is read whole
            raise InvalidRequest(
                f"input[{i}] is {len(out)} tokens with its images, more than the model's {self.info.max_model_len}; "
                "an input with images is not processed in chunks",
                param="input",
            )
        return out

    def _shape(self, x: Input, i: int) -> Shaped:
        if self.prompt in (JINA_RERANK, QWEN3_VL_RERANK):
            return self._pair(x, i)
        if isinstance(x, str):
            return Shaped(x, [])
        if isinstance(x, list):
            if self.pad_id in x:
                raise InvalidRequest(f"input[{i}]: token ids may not hold image tokens", param="input")
            return Shaped(None, [], ids=x)
        if isinstance(x, ChatInput):
            return Shaped(self.encoder.render_chat(x), [])
        if isinstance(x, MediaInput):
            if x.chat is not None:
                chat = ChatInput(
                    [_image_parts(m) for m in x.chat],
                    add_generation_prompt=x.add_generation_prompt,
                    continue_final_message=x.continue_final_message,
                    chat_template_kwargs=x.chat_template_kwargs,
                )
                return Shaped(self.encoder.render_chat(chat), x.media)
            if self.encoder.chat_template:
                one = ChatInput([{"role": "user", "content": self._content(x)}])
                return Shaped(self.encoder.render_chat(one), x.media)
            return Shaped("".join(p if isinstance(p, str) else self.placeholder for p in x.parts), x.media)
        raise InvalidRequest(
            f"input[{i}]: model {self.info.served_model_name!r} does not take this input", param="input"
        )

    @staticmethod
    def _content(x: MediaInput) -> list[dict[str, Any]]:
        return [{"type": "text", "text": p} if isinstance(p, str) else {"type": p.kind} for p in x.parts]

    def _pair(self, x: Input, i: int) -> Shaped:
        """A reranker's prompt for a (query, document) pair (module doc)."""
        join = "\n" if self.prompt == QWEN3_VL_RERANK else ""  # a document's parts, as each reranker's reader joins
        if isinstance(x, TextPair):  # each side cut to its content-token cap first (0: none)
            query = self.encoder.cut(x.text, x.max_text_tokens) if x.max_text_tokens else x.text
            document = self.encoder.cut(x.text_pair, x.max_pair_tokens) if x.max_pair_tokens else x.text_pair
            images: list[MediaRef] = []
            instruction = x.instruction
        elif isinstance(x, MediaInput) and x.role == "pair" and len(x.parts) >= 2:
            doc, last = x.parts[:-1], x.parts[-1]
            document = join.join(p if isinstance(p, str) else self.placeholder for p in doc)
            query = last if isinstance(last, str) else self.placeholder
            instruction = (x.chat_template_kwargs or {}).get("instruction")
            images = [p for p in doc if isinstance(p, MediaRef)] + ([last] if isinstance(last, MediaRef) else [])
        else:
            raise InvalidRequest(
                f"input[{i}]: model {self.info.served_model_name!r} scores (query, document) pairs only",
                param="input",
            )
        if self.prompt == QWEN3_VL_RERANK:
            return Shaped(qwen3_vl_rerank(query, document, instruction), images)
        if instruction is not None:
            raise InvalidRequest(f"model {self.info.served_model_name!r} {NO_INSTRUCTION}", param="instruction")
        suffix = () if self.score_token_id is None else (int(self.score_token_id),)
        return Shaped(f"**Document**:\n{document}\n**Query**:\n{query}", images, suffix=suffix)


def _image_parts(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message with each image part as ``{"type": "image"}`` (the template writes the placeholder; the
    image's URL or bytes stay out of the renderer)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, dict) and (kind in ("image_url", "image") or "image_url" in part):
            parts.append({"type": "image"})
        elif isinstance(part, dict) and (kind in ("input_audio", "audio_url") or "input_audio" in part):
            parts.append({"type": "audio"})
        else:
            parts.append(part)
    return {**message, "content": parts}


def make_plan(info: ModelInfo, encoder: TextEncoder, settings: dict[str, Any]) -> QwenVLPlan:
    return QwenVLPlan(info, encoder, settings)
