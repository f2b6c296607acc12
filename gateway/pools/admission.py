"""A pool's admission: whether it takes one more job now, counted in the model's tokens (and calls per worker).

One ``Admission`` per ``WorkerPool`` holds every gateway-side limit on the work
the pool accepts (``AdmissionLimits``), so none lives anywhere else:

- ``max_inputs_per_request`` and ``max_chars_per_input``: a job with more
  inputs, or an input with more characters (``Job.longest_chars``), is the
  request's own fault, a 400 (``InvalidRequest``) that no other pool would
  answer otherwise, before any tokenizing;
- ``max_calls_per_worker`` (``max_in_flight_per_worker``): a worker with that
  many jobs in flight is not picked; when every ready worker is at it, 429;
- queued work, in tokens the model's tokenizer counted (the gateway tokenizes
  every call before it reaches a pool, ``shared.inputs.front``): the work that
  runs before a new job is done may not pass
  ``max_queued_tokens`` or, when that is not set, ``max_queued_s`` seconds of
  the pool's measured capacity (the sum of its ready workers' ``tokens_per_s``,
  from their health answers; at least ``MIN_QUEUED_TOKENS``; no limit until a
  worker measured one). On by default (``GatewayConfig.max_queued_s``, 5 s).
  Since the workers' fair policy serves jobs round robin, that work is the
  job's own tokens plus, of each admitted job, at most as many
  (``work_before``): a 1-input request beside one of 2,048 inputs is admitted
  (it runs beside it), a burst of equal jobs is admitted up to the limit. A
  job past it is refused with 429, except when nothing is admitted (a lone job
  bigger than the limit still runs, or it never could); its ``Retry-After`` is
  how long the excess takes to drain at that capacity. The capacity, the limit
  and every job are in the same counted tokens, for any language or code.

With ``--gateway-processes N`` each process admits only what it sent itself,
so each gets 1/N of the limits the workers share (``gateway.pools.fleet.
admission_limits``): ``max_calls_per_worker // N`` (at least 1),
``max_queued_tokens // N``, ``max_queued_s / N`` of the measured capacity
(each still at least ``MIN_QUEUED_TOKENS``). The kernel spreads connections
evenly over the processes, so together they admit about what one process
would; a process that gets more than its share refuses early (429) while
another has room, and the client's retry lands on any of them. The workers'
own bounded queues still refuse what is more than they hold.

A refusal is ``Overloaded`` (with its ``reason`` and ``retry_after_s``), raised
before anything is sent, so ``ModelPools`` tries the model's next pool. What
was admitted is released when the job ends, retried or not (a retry after a
lost worker is not admitted again). Refusals are counted by reason
(``refused``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from poolgate.shared.domain.errors import InvalidRequest, Overloaded

M = TypeVar("M")

# Why a job was refused (the metrics' ``reason`` label).
REASON_WORKERS_BUSY = "workers_busy"
REASON_QUEUE_FULL = "queue_full"

MIN_QUEUED_TOKENS = 4096  # the capacity-derived limit never goes below this
MAX_RETRY_AFTER_S = 60


@dataclass(frozen=True)
class AdmissionLimits:
    """A pool's limits (module doc); None = no limit."""

    max_inputs_per_request: int | None = None
    max_chars_per_input: int | None = None
    max_calls_per_worker: int | None = None
    max_queued_tokens: int | None = None
    max_queued_s: float | None = None  # used when max_queued_tokens is None

    def __post_init__(self) -> None:
        for name in ("max_inputs_per_request", "max_chars_per_input", "max_calls_per_worker", "max_queued_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.max_queued_s is not None and self.max_queued_s <= 0:
            raise ValueError(f"max_queued_s must be > 0, got {self.max_queued_s}")


class Admission:
    """The pool's admitted work and the decision on the next job (module doc)."""

    def __init__(self, limits: AdmissionLimits | None = None, *, model: str = ""):
        self.limits = limits or AdmissionLimits()
        self.model = model
        self.tokens = 0  # counted tokens of admitted jobs not yet finished
        self.jobs = 0
        self._sizes: list[int] = []  # each admitted job's tokens
        self.refused: Counter[str] = Counter()  # reason -> refusals

    def check(self, inputs: int, longest_chars: int = 0) -> None:
        """A request's own limits: its input count and its longest input (400, the same on every pool)."""
        cap = self.limits.max_inputs_per_request
        if cap is not None and inputs > cap:
            raise InvalidRequest(f"Too many inputs: {inputs} in one request; the limit is {cap}.", param="input")
        chars = self.limits.max_chars_per_input
        if chars is not None and longest_chars > chars:
            raise InvalidRequest(
                f"An input of {longest_chars} characters is too long; the limit is {chars} "
                "characters per input (--max-chars-per-input).",
                param="input",
            )

    def candidates(self, members: Iterable[M], calls_of: Callable[[M], int]) -> list[M]:
        """The members that may take one more job (below ``max_calls_per_worker``); 429 when none may."""
        members = list(members)
        cap = self.limits.max_calls_per_worker
        if cap is None:
            return members
        free = [m for m in members if calls_of(m) < cap]
        if members and not free:
            self._refuse(REASON_WORKERS_BUSY, f"Every worker serving model '{self.model}' is busy; retry shortly.")
        return free

    def queue_limit(self, capacity: float) -> int | None:
        """The queued-token limit at ``capacity`` tokens/s (module doc); None = no limit."""
        if self.limits.max_queued_tokens is not None:
            return self.limits.max_queued_tokens
        if self.limits.max_queued_s is None or capacity <= 0:
            return None
        return max(MIN_QUEUED_TOKENS, int(capacity * self.limits.max_queued_s))

    def work_before(self, tokens: int) -> int:
        """The work that runs before a new job of ``tokens`` is done, as the workers' fair batch policy
        shares the device (round robin over jobs): its own tokens, and of every admitted job at most as
        many (a job bigger than the newcomer runs beside it, not before it)."""
        return tokens + sum(min(size, tokens) for size in self._sizes)

    def admit(self, tokens: int, capacity: float = 0.0) -> None:
        """Count a job of ``tokens`` counted tokens in, or refuse it (429) when the work that would run
        before it is done passes the limit; ``capacity``: the pool's measured tokens/s (0 = not known)."""
        cap = self.queue_limit(capacity)
        if cap is not None and self.jobs and (before := self.work_before(tokens)) > cap:
            self._refuse(
                REASON_QUEUE_FULL,
                f"Model '{self.model}' cannot take this request of {tokens} tokens now: {before} tokens of "
                f"work would run before it is done ({self.tokens} tokens queued; the limit is {cap}); "
                "retry shortly.",
                retry_after(before - cap, capacity),
            )
        self.tokens += tokens
        self.jobs += 1
        self._sizes.append(tokens)

    def release(self, tokens: int) -> None:
        """The admitted job of ``tokens`` ended (answered, failed or cancelled)."""
        self.tokens -= tokens
        self.jobs -= 1
        self._sizes.remove(tokens)

    def _refuse(self, reason: str, message: str, retry_after_s: float | None = None) -> None:
        self.refused[reason] += 1
        raise Overloaded(message, retry_after_s=retry_after_s, reason=reason)


def retry_after(excess_tokens: int, capacity: float) -> float | None:
    """Whole seconds until ``excess_tokens`` drain at ``capacity`` tokens/s (1 to 60); None if unknown."""
    if capacity <= 0:
        return None
    return float(min(MAX_RETRY_AFTER_S, max(1, math.ceil(excess_tokens / capacity))))
