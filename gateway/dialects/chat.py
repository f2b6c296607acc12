"""vLLM's chat-style request fields (``messages`` and the chat options) and their conversion to ``ChatInput``.

Messages are OpenAI chat messages, text only: ``content`` is a string or a
list of ``{"type": "text", "text": ...}`` parts (joined with newlines, as
vLLM's "string" content format does). The worker renders each conversation
with the model's own chat template. A template sent with the request is
refused, as vLLM refuses it without ``--trust-request-chat-template``.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, StrictStr

from poolgate.shared.errors import InvalidRequest
from poolgate.shared.wire import ChatInput

UNTRUSTED_TEMPLATE = ("Chat template is passed with request, but --trust-request-chat-template is not set. "
                      "Refused request with untrusted chat template.")
BOTH_FLAGS = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."


class ContentPart(BaseModel):
    """One part of a message's content; only ``text`` parts are served."""

    model_config = ConfigDict(extra="allow")
    type: StrictStr
    text: StrictStr | None = None


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


def chat_inputs(conversations: list[Conversation], options: ChatOptions) -> list[ChatInput]:
    """One ``ChatInput`` per conversation; 400 for what vLLM refuses."""
    if options.chat_template is not None:
        raise InvalidRequest(UNTRUSTED_TEMPLATE, param="chat_template")
    if options.continue_final_message and options.add_generation_prompt:
        raise InvalidRequest(BOTH_FLAGS, param="continue_final_message")
    return [ChatInput(messages=[_message(m) for m in conversation],
                      add_generation_prompt=options.add_generation_prompt,
                      continue_final_message=options.continue_final_message,
                      chat_template_kwargs=options.chat_template_kwargs)
            for conversation in conversations]


def conversations(value: Conversation | list[Conversation]) -> list[Conversation]:
    """One conversation or a list of them, as a list of conversations."""
    if value and isinstance(value[0], ChatMessage):
        return [value]
    return list(value)


def _message(message: ChatMessage) -> dict:
    body = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        kinds = [p.type for p in message.content if p.type != "text"]
        if kinds:
            raise InvalidRequest(f"Only text content is served; got a content part of type '{kinds[0]}'.",
                                 param="messages")
        body["content"] = "\n".join(p.text or "" for p in message.content)
    elif message.content is None:
        body["content"] = ""
    return body
