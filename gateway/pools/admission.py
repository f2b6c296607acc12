"""A pool's admission: whether it takes one more job now, counted in estimated tokens (and calls per worker).

One ``Admission`` per ``WorkerPool`` holds every gateway-side limit on the work
the pool accepts (``AdmissionLimits``), so none lives anywhere else:

- ``max_inputs_per_request``: a job with more inputs is the request's own
  fault, a 400 (``InvalidRequest``) that no other pool would answer otherwise;
- ``max_calls_per_worker`` (``max_in_flight_per_worker``): a worker with that
  many jobs in flight is not picked; when every ready worker is at it, 429;
- ``max_queued_tokens``: the pool's admitted, unfinished work in estimated
  tokens (``gateway.pools.member.estimate_tokens``). A job that would take it
  past the limit is refused with 429, except when nothing is admitted (a lone
  job bigger than the limit still runs, or it never could).

A refusal is ``Overloaded``, raised before anything is sent, so ``ModelPools``
tries the model's next pool. What was admitted is released when the job ends,
retried or not (a retry after a lost worker is not admitted again). Refusals
are counted by reason (``refused``) for the metrics.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, TypeVar

from poolgate.shared.errors import InvalidRequest, Overloaded

M = TypeVar("M")

# Why a job was refused (the metrics' ``reason`` label).
REASON_WORKERS_BUSY = "workers_busy"
REASON_QUEUE_FULL = "queue_full"


@dataclass(frozen=True)
class AdmissionLimits:
    """A pool's limits (module doc); None = no limit."""

    max_inputs_per_request: int | None = None
    max_calls_per_worker: int | None = None
    max_queued_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_inputs_per_request", "max_calls_per_worker", "max_queued_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


class Admission:
    """The pool's admitted work and the decision on the next job (module doc)."""

    def __init__(self, limits: AdmissionLimits | None = None, *, model: str = ""):
        self.limits = limits or AdmissionLimits()
        self.model = model
        self.tokens = 0  # estimated tokens of admitted jobs not yet finished
        self.jobs = 0
        self.refused: Counter[str] = Counter()  # reason -> refusals

    def check(self, inputs: int) -> None:
        """A request's own limit: its input count (400, the same on every pool)."""
        cap = self.limits.max_inputs_per_request
        if cap is not None and inputs > cap:
            raise InvalidRequest(f"Too many inputs: {inputs} in one request; the limit is {cap}.", param="input")

    def candidates(self, members: Iterable[M], calls_of) -> list[M]:
        """The members that may take one more job (below ``max_calls_per_worker``); 429 when none may."""
        members = list(members)
        cap = self.limits.max_calls_per_worker
        if cap is None:
            return members
        free = [m for m in members if calls_of(m) < cap]
        if members and not free:
            self._refuse(REASON_WORKERS_BUSY, f"Every worker serving model '{self.model}' is busy; retry shortly.")
        return free

    def admit(self, tokens: int) -> None:
        """Count a job of ``tokens`` estimated tokens in, or refuse it (429) when the pool is full."""
        cap = self.limits.max_queued_tokens
        if cap is not None and self.jobs and self.tokens + tokens > cap:
            self._refuse(REASON_QUEUE_FULL, f"Model '{self.model}' has {self.tokens} tokens of work queued "
                                            f"(the limit is {cap}); retry shortly.")
        self.tokens += tokens
        self.jobs += 1

    def release(self, tokens: int) -> None:
        """The admitted job of ``tokens`` ended (answered, failed or cancelled)."""
        self.tokens -= tokens
        self.jobs -= 1

    def _refuse(self, reason: str, message: str) -> None:
        self.refused[reason] += 1
        raise Overloaded(message)
