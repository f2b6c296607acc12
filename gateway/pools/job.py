"""One piece of work a pool sends to one of its workers: a pooling call or a tokenizer op.

Every op a worker answers goes through the pool's one submit (pick → admission
→ send → retry → accounting, ``gateway.pools.pool``) as a ``Job``: what to send
to the chosen client, and what admission, the pick and the retry need to know
(its estimated tokens, input count, deadline, priority).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from poolgate.shared import wire
from poolgate.shared.transport import WorkerClient
from poolgate.shared.wire import ChatInput, Input, PoolingCall


@dataclass(frozen=True)
class Job:
    """``send(client)`` runs the job on one worker; the rest describes it (module doc)."""

    request_id: str
    send: Callable[[Any], Awaitable[Any]]
    tokens: int  # estimated (``wire.estimate_tokens``): the pick's load and admission's count
    inputs: int = 1
    deadline: float | None = None  # unix time; None = no deadline
    priority: int = 0
    longest_chars: int = 0  # the most characters of one input (admission's per-input cap)


def pooling_job(call: PoolingCall) -> Job:
    """A pooling call (every pooling route)."""
    return Job(
        call.request_id,
        lambda client: client.pool(call),
        sum(wire.estimate_tokens(x) for x in call.inputs),
        len(call.inputs),
        call.deadline,
        call.priority,
        max(map(chars, call.inputs), default=0),
    )


def chars(x: Input) -> int:
    """The characters of one input: a text's, every text field of an object input, a chat's contents."""
    if isinstance(x, str):
        return len(x)
    if isinstance(x, list):
        return 0  # token ids
    if isinstance(x, ChatInput):
        return sum(len(str(m.get("content") or "")) for m in x.messages)
    values = (getattr(x, f.name) for f in fields(x)) if is_dataclass(x) else ()
    return sum(len(v) for v in values if isinstance(v, str))


def tokenize_job(
    request_id: str,
    x: Input,
    *,
    deadline: float | None = None,
    add_special_tokens: bool = True,
    return_token_strs: bool = False,
) -> Job:
    """One input's token ids (and token strings) from the model's tokenizer (``/tokenize``)."""

    async def send(client: WorkerClient) -> tuple[list[int], list[str | None] | None]:
        return await client.tokenize(x, add_special_tokens=add_special_tokens, return_token_strs=return_token_strs)

    return Job(request_id, send, wire.estimate_tokens(x), 1, deadline, longest_chars=chars(x))


def token_details_job(
    request_id: str, text: str, *, deadline: float | None = None, add_special_tokens: bool = True
) -> Job:
    """A text's tokens with their strings, offsets and special flags (TEI's ``/tokenize``)."""

    async def send(client: WorkerClient) -> dict[str, Any]:
        return await client.token_details(text, add_special_tokens=add_special_tokens)

    return Job(request_id, send, wire.estimate_tokens(text), 1, deadline, longest_chars=len(text))


def detokenize_job(
    request_id: str, ids: list[int], *, deadline: float | None = None, skip_special_tokens: bool = False
) -> Job:
    """The text of ``ids`` (``/detokenize``, TEI's ``/decode``)."""
    return Job(
        request_id,
        lambda client: client.detokenize(ids, skip_special_tokens=skip_special_tokens),
        len(ids),
        1,
        deadline,
    )
