"""One piece of work a pool sends to one of its workers: a tokenized pooling call.

Every call a worker answers goes through the pool's one submit (pick →
admission → send → retry → accounting, ``gateway.pools.pool``) as a ``Job``:
what to send to the chosen client, and what admission, the pick and the retry
need to know (its counted tokens, deadline, priority, lane: a bulk job is
admitted and picked below every live one, ``gateway.pools.admission``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from poolgate.shared.domain.lanes import LIVE, Lane
from poolgate.shared.wire.token_call import TokenCall


@dataclass(frozen=True)
class Job:
    """``send(client)`` runs the job on one worker; the rest describes it (module doc)."""

    request_id: str
    send: Callable[[Any], Awaitable[Any]]
    tokens: int  # counted by the model's tokenizer: the pick's load and admission's count
    deadline: float | None = None  # unix time; None = no deadline
    priority: int = 0
    lane: Lane = LIVE


def pooling_job(call: TokenCall) -> Job:
    """A tokenized pooling call (every pooling route)."""
    return Job(
        call.request_id, lambda client: client.pool(call), int(len(call.ids)), call.deadline, call.priority, call.lane
    )
