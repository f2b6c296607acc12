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

Bulk jobs (``Job.lane == "bulk"``, ``shared.domain.lanes``: a batch job's
lines, which the workers run after every live call) never make a live job
wait or be refused: every live decision ignores admitted bulk jobs (a live
job's ``work_before``, its lone-job exception, the worker slots it counts
against ``max_calls_per_worker``). A bulk job counts everything: the work
before it is its own tokens, every admitted live job whole (live runs first)
and, of each admitted bulk job, at most as many as its own (round robin among
bulk); past the limit it gets the same 429 ``queue_full`` with its
``Retry-After`` (the job runner backs off), except when nothing at all is
admitted; and it takes a worker slot only below the cap counting all of the
worker's calls. So live work may use the whole limit and every slot
whatever bulk work is admitted, and bulk work is admitted only into what
live work leaves.

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
lost worker is not admitted again). What it decided is counted for the
metrics (``gateway.telemetry.pool_series``): jobs and tokens admitted by lane
(``admitted``, ``admitted_tokens``), refusals by reason and lane (``refused``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from poolgate.shared.domain.errors import InvalidRequest, Overloaded
from poolgate.shared.domain.lanes import BULK, LANES, LIVE, Lane

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
        self.tokens = 0  # counted tokens of admitted jobs not yet finished (both lanes)
        self.jobs = 0
        self._sizes: dict[Lane, list[int]] = {lane: [] for lane in LANES}  # each admitted job's tokens, by lane
        self.admitted: Counter[Lane] = Counter()  # lane -> jobs admitted, ever
        self.admitted_tokens: Counter[Lane] = Counter()  # lane -> their counted tokens
        self.refused: Counter[tuple[str, Lane]] = Counter()  # (reason, lane) -> refusals

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

    def candidates(self, members: Iterable[M], calls_of: Callable[[M, Lane], int], lane: Lane = LIVE) -> list[M]:
        """The members that may take one more job of ``lane`` (below ``max_calls_per_worker``, counting a
        member's live calls for a live job, all its calls for a bulk one; ``calls_of(member, lane)``: its
        calls in flight in that lane); 429 when none may."""
        members = list(members)
        cap = self.limits.max_calls_per_worker
        if cap is None:
            return members
        lanes = LANES if lane == BULK else (LIVE,)
        free = [m for m in members if sum(calls_of(m, counted) for counted in lanes) < cap]
        if members and not free:
            self._refuse(
                REASON_WORKERS_BUSY, lane, f"Every worker serving model '{self.model}' is busy; retry shortly."
            )
        return free

    def queue_limit(self, capacity: float) -> int | None:
        """The queued-token limit at ``capacity`` tokens/s (module doc); None = no limit."""
        if self.limits.max_queued_tokens is not None:
            return self.limits.max_queued_tokens
        if self.limits.max_queued_s is None or capacity <= 0:
            return None
        return max(MIN_QUEUED_TOKENS, int(capacity * self.limits.max_queued_s))

    def work_before(self, tokens: int, lane: Lane = LIVE) -> int:
        """The work that runs before a new job of ``tokens`` is done, as the workers' fair batch policy
        shares the device (round robin over jobs): its own tokens, and of every admitted job of its lane
        at most as many (a job bigger than the newcomer runs beside it, not before it); a bulk job also
        waits for every admitted live job whole, a live job for no bulk one (module doc)."""
        mine = tokens + sum(min(size, tokens) for size in self._sizes[lane])
        return mine + sum(self._sizes[LIVE]) if lane == BULK else mine

    def admit(self, tokens: int, capacity: float = 0.0, lane: Lane = LIVE) -> None:
        """Count a job of ``tokens`` counted tokens in, or refuse it (429) when the work that would run
        before it is done passes the limit; ``capacity``: the pool's measured tokens/s (0 = not known).
        A live job is measured against admitted live jobs only, a bulk one against all (module doc)."""
        cap = self.queue_limit(capacity)
        counted = self._sizes[LIVE] if lane == LIVE else [*self._sizes[LIVE], *self._sizes[BULK]]
        if cap is not None and counted and (before := self.work_before(tokens, lane)) > cap:
            what = "request" if lane == LIVE else "bulk request"
            self._refuse(
                REASON_QUEUE_FULL,
                lane,
                f"Model '{self.model}' cannot take this {what} of {tokens} tokens now: {before} tokens of "
                f"work would run before it is done ({sum(counted)} tokens queued; the limit is {cap}); "
                "retry shortly.",
                retry_after(before - cap, capacity),
            )
        self.tokens += tokens
        self.jobs += 1
        self._sizes[lane].append(tokens)
        self.admitted[lane] += 1
        self.admitted_tokens[lane] += tokens

    def queued(self, lane: Lane) -> int:
        """Counted tokens of the admitted jobs of ``lane`` not yet ended."""
        return sum(self._sizes[lane])

    @property
    def live_jobs(self) -> int:
        """Live jobs admitted and not yet ended."""
        return len(self._sizes[LIVE])

    def release(self, tokens: int, lane: Lane = LIVE) -> None:
        """The admitted job of ``tokens`` in ``lane`` ended (answered, failed or cancelled)."""
        self.tokens -= tokens
        self.jobs -= 1
        self._sizes[lane].remove(tokens)

    def _refuse(self, reason: str, lane: Lane, message: str, retry_after_s: float | None = None) -> None:
        self.refused[reason, lane] += 1
        raise Overloaded(message, retry_after_s=retry_after_s, reason=reason)


def retry_after(excess_tokens: int, capacity: float) -> float | None:
    """Whole seconds until ``excess_tokens`` drain at ``capacity`` tokens/s (1 to 60); None if unknown."""
    if capacity <= 0:
        return None
    return float(min(MAX_RETRY_AFTER_S, max(1, math.ceil(excess_tokens / capacity))))
