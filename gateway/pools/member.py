"""One worker's place in a pool: the client protocol, the member's state and load (and how much of it is bulk)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from poolgate.shared.domain.errors import Unavailable
from poolgate.shared.domain.lanes import BULK, LIVE, Lane
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.wire.messages import ModelInfo, PoolingResult
from poolgate.shared.wire.token_call import TokenCall

State = Literal["starting", "ready", "down", "draining"]


class Client(Protocol):
    """The part of ``shared.wire.transport.WorkerClient`` a pool uses."""

    address: str

    async def info(self) -> ModelInfo: ...

    async def tokenizer(self) -> tuple[ModelInfo, TokenizerFiles]: ...

    async def pool(self, call: TokenCall) -> PoolingResult: ...

    async def health(self) -> dict[str, Any]: ...

    async def lora(self, action: str, name: str, path: str | None = None) -> None: ...

    async def close(self) -> None: ...


async def check(client: Client, timeout_s: float | None) -> tuple[str | None, dict[str, Any]]:
    """(None, its answer) when ``client`` answers its health check in time and says it is ready, else
    (why not, {})."""
    try:
        answer = await asyncio.wait_for(client.health(), timeout_s)
    except TimeoutError:
        return f"no health answer within {timeout_s}s", {}
    except Unavailable as exc:
        return str(exc), {}
    except Exception as exc:  # an error answer from the worker counts as not healthy
        return f"health check failed: {exc}", {}
    if answer.get("ready") is False:
        return "the worker says it is not ready" + (" (draining)" if answer.get("draining") else ""), {}
    return None, answer


def tokens_per_s(answer: dict) -> float:
    """The worker's measured capacity from its health answer (``pipeline.tokens_per_s``; 0: not yet known)."""
    rate = (answer.get("pipeline") or {}).get("tokens_per_s")
    return float(rate) if isinstance(rate, (int, float)) and rate > 0 else 0.0


@dataclass(eq=False)
class Member:
    """One client in a pool: its state, its load and a ``lost`` event the calls on it watch."""

    client: Client
    state: State
    calls: int = 0
    tokens: int = 0
    bulk_calls: int = 0  # of ``calls``, those in the bulk lane (shared.domain.lanes)
    bulk_tokens: int = 0  # of ``tokens``, those of bulk calls
    recoveries: int = 0
    picked: int = 0  # when it was last picked (a pool-wide count): ties go to the least recent
    error: str | None = None
    since: float = field(default_factory=time.monotonic)  # when it entered its state
    answered: float = 0.0  # when it last answered a call (monotonic): a sign of life besides health checks
    tokens_per_s: float = 0.0  # its measured capacity, from its last health answer (0: not known yet)
    lost: asyncio.Event = field(default_factory=asyncio.Event)  # set while down: calls on it fail over
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while no call is in flight

    def __post_init__(self) -> None:
        self.idle.set()


def calls_in(member: Member, lane: Lane) -> int:
    """The member's calls in flight in ``lane``."""
    return member.bulk_calls if lane == BULK else member.calls - member.bulk_calls


def load(member: Member, lane: Lane = LIVE) -> tuple[int, ...]:
    """The pick order: fewest outstanding tokens, then fewest calls, then least recently picked. A live job
    looks at live tokens first (the worker runs them before any bulk work), then at all of them."""
    if lane == BULK:
        return member.tokens, member.calls, member.picked
    return member.tokens - member.bulk_tokens, member.tokens, member.calls, member.picked
