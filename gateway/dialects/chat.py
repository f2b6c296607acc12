"""vLLM's chat-style request fields (``messages`` and the chat options) and their conversion to ``ChatInput``.

``CompletionOrChatBody`` is the body of the routes that take either style
(``/v1/embeddings``, ``/classify``, ``/pooling``): ``input`` as texts or token
ids, or a conversation (list) in ``input`` or ``messages``.

Messages are OpenAI chat messages: ``content`` is a string or a list of
content parts (``dialects.media_parts``: text, ``image_url``, ``input_audio``,
``audio_url``). A conversation of text only is a ``ChatInput``: its text parts
joined with newlines, as vLLM's "string" content format does, rendered with
the model's own chat template. A conversation with an image or audio part is
a ``MediaInput``: every message's parts in order, and the messages themselves
(short forms spelled out) for a model whose chat template places the media
tokens; so is every conversation sent to a model that reads media
(``ModelInfo.modalities``; a CLIP text query is a chat of one text part, as
vLLM serves it), whose media plan reads them all. A template sent with the request is refused, as vLLM refuses it
without ``--trust-request-chat-template``.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from poolgate.gateway.dialects.body import validation_failure
from poolgate.gateway.dialects.encoding import EmbedDType, EncodingFormat, Endianness
from poolgate.gateway.dialects.media_parts import ContentPart, canonical, has_media, part_of
from poolgate.gateway.dialects.request import CompletionInput, PoolingBody
from poolgate.gateway.dialects.route import AsksEncodings
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import ChatInput, Input, ModelInfo

UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)
BOTH_FLAGS = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
ONE_OF = "Exactly one of `input` or `messages` must be given."


class ChatMessage(BaseModel):
    """An OpenAI chat message; other keys (``name``, ...) are passed to the template as they are."""

    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[ContentPart] | None = None


Conversation = list[ChatMessage]


class ChatOptions(BaseModel):
    """vLLM's chat-style options (defaults as vLLM's ``ChatRequestMixin``)."""

    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def no_default(schema: dict) -> None:
    schema.pop("default", None)


class CompletionOrChatBody(PoolingBody, ChatOptions):
    """``input`` (texts, token ids, or conversations) or ``messages``; unknown fields are ignored."""

    # Either one, never null (a default is not validated, an explicit null is; nor is it documented): a None
    # default on a type without None, which mypy refuses (as it refuses widening PoolingBody's fields).
    input: CompletionInput | Conversation | list[Conversation] = Field(  # type: ignore[assignment]
        None, json_schema_extra=no_default
    )
    messages: Conversation | list[Conversation] = Field(None, json_schema_extra=no_default)  # type: ignore[assignment]
    add_special_tokens: bool | None = None  # type: ignore[assignment]  # None: True for texts and ids, False for chat

    @model_validator(mode="before")
    @classmethod
    def _input_or_messages(cls, data: Any) -> Any:
        if isinstance(data, dict) and "input" not in data and "messages" not in data:
            raise validation_failure(
                "1 validation error:\n  body.input: Field required [type=missing]", param="body.input"
            )
        return data

    def chat(self) -> list[Conversation] | None:
        """The conversations of a chat-style request, or None for a completion-style one."""
        given = {"input", "messages"} & self.model_fields_set  # (neither can be given as null)
        if len(given) != 1:
            raise InvalidRequest(ONE_OF, param="input")
        if "messages" in given:
            return conversations(self.messages)
        return conversations(self.input) if is_chat(self.input) else None

    def call_inputs(self, info: ModelInfo | None = None) -> tuple[list[Input], bool]:
        """The inputs to pool and whether to add special tokens (as asked, else vLLM's default per style);
        ``info``: the model's, whose modalities decide how a text-only conversation is read."""
        chats = self.chat()
        media = info is not None and reads_media(info)
        inputs: list[Input] = list(chat_inputs(chats, self, media=media)) if chats is not None else self.inputs()
        # vLLM's default: special tokens for texts and ids, none for a rendered chat; a media model's plan reads
        # its chats' parts itself and tokenizes their text as a text (CLIP's BOS and EOS included)
        special = (chats is None or media) if self.add_special_tokens is None else self.add_special_tokens
        return inputs, special


def reads_media(info: ModelInfo) -> bool:
    """Whether the model reads images or audio (its media plan reads every input)."""
    return any(m != "text" for m in info.modalities)


def chat_inputs(
    conversations: list[Conversation], options: ChatOptions, *, media: bool = False
) -> list[ChatInput | MediaInput]:
    """One input per conversation: a ``ChatInput`` for text only, a ``MediaInput`` with an image or audio part
    (every conversation with ``media``: the model reads media); 400 for what vLLM refuses and for a part
    poolgate does not serve."""
    if options.chat_template is not None:
        raise InvalidRequest(UNTRUSTED_TEMPLATE, param="chat_template")
    if options.continue_final_message and options.add_generation_prompt:
        raise InvalidRequest(BOTH_FLAGS, param="continue_final_message")
    inputs: list[ChatInput | MediaInput] = []
    for c, conversation in enumerate(conversations):
        read = [
            _read(m, f"messages[{c}][{i}]" if len(conversations) > 1 else f"messages[{i}]")
            for i, m in enumerate(conversation)
        ]
        parts = [p for _, message_parts in read for p in message_parts]
        if media or has_media(parts):
            inputs.append(
                MediaInput(
                    parts=tuple(parts),
                    chat=tuple(body for body, _ in read),
                    add_generation_prompt=options.add_generation_prompt,
                    continue_final_message=options.continue_final_message,
                    chat_template_kwargs=options.chat_template_kwargs,
                )
            )
        else:
            inputs.append(
                ChatInput(
                    messages=[_text_message(body) for body, _ in read],
                    add_generation_prompt=options.add_generation_prompt,
                    continue_final_message=options.continue_final_message,
                    chat_template_kwargs=options.chat_template_kwargs,
                )
            )
    return inputs


def text_chat(conversation: Conversation, options: ChatOptions) -> ChatInput:
    """One conversation of text only (``/tokenize``); 400 for an image or audio part."""
    (one,) = chat_inputs([conversation], options)
    if isinstance(one, MediaInput):
        raise InvalidRequest(
            "this route takes text messages: an image or audio part is not tokenized here", param="messages"
        )
    return one


def conversations(value: Conversation | list[Conversation]) -> list[Conversation]:
    """One conversation or a list of them, as a list of conversations."""
    messages = [m for m in value if isinstance(m, ChatMessage)]
    return [messages] if messages else [c for c in value if isinstance(c, list)]


def is_chat(value: object) -> TypeGuard[Conversation | list[Conversation]]:
    """Whether a parsed ``input`` is a conversation or a list of them (not texts or token ids)."""
    first = value[0] if isinstance(value, list) and value else None
    if isinstance(first, list):
        first = first[0] if first else None
    return isinstance(first, ChatMessage)


def _read(message: ChatMessage, where: str) -> tuple[dict, list[str | MediaRef]]:
    """The message as a dict (its content parts spelled out) and its parts as text or media, in order."""
    body = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        parts = [part_of(p, f"{where}.content[{j}]", allow_missing_text=True) for j, p in enumerate(message.content)]
        body["content"] = [canonical(p, ref) for p, ref in zip(message.content, parts, strict=True)]
        return body, parts
    body["content"] = message.content or ""
    return body, [body["content"]] if message.content else []


def _text_message(body: dict) -> dict:
    """A text-only message with its text parts joined by newlines."""
    if isinstance(body["content"], list):
        return {**body, "content": "\n".join(p["text"] for p in body["content"])}
    return body


class EncodedBody(CompletionOrChatBody, AsksEncodings):
    """A completion-or-chat body whose arrays come back encoded as asked (``/v1/embeddings``, ``/pooling``)."""

    encoding_format: EncodingFormat = "float"
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"
    dimensions: int | None = None

    @property
    def encoding_formats(self) -> tuple[str, ...]:
        """The one ``encoding_format`` asked."""
        return (self.encoding_format,)
