"""A pool of workers serving one model: least-loaded pick by outstanding tokens, member states, failover.

Each member (one worker's client) has a state:

- ``starting``: its process is (re)starting; no calls, no health checks (the supervisor owns it);
- ``ready``: in rotation;
- ``down``: lost or not answering; health checks (``probe``) bring it back when it answers;
- ``draining``: leaving the pool (``remove``); no new calls, its calls in flight finish.

Load is the member's OUTSTANDING TOKENS: the sum of its calls' token counts in
flight (counted by the model's tokenizer before the call reached the pool,
``shared.inputs.front``), counted here when a call is picked (so concurrent
picks see each other) and released when it ends. A live job goes to the member
with the fewest outstanding LIVE tokens (its worker runs bulk work after every
live call, ``shared.domain.lanes``), ties to the fewest in all; a bulk job to
the fewest in all.

Every call a worker answers is a ``Job`` (``gateway.pools.job``) and goes
through the one ``run``: pick → admission (``gateway.pools.admission``: the
per-worker call cap, the pool's queued tokens) → send → retry → accounting.
The model's tokenizer (``front``, a ``shared.inputs.front.Front``) sits beside
the pool: every pool of one model has the same one.

Failover: a job whose worker is lost (``Unavailable``: connection lost, worker
shutting down, or marked down by a health check while the job was on it) is
retried ONCE on another ready member, within the job's deadline; so is a job the
worker itself refused because its queue is full (``Overloaded``, the member stays
ready). A request's own fault (4xx), an internal error and a passed deadline are
never retried. The retry ignores the per-worker cap: the job was admitted already.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from poolgate.gateway.pools.admission import Admission, AdmissionLimits
from poolgate.gateway.pools.job import Job, pooling_job
from poolgate.gateway.pools.member import Client, Member, State, calls_in, check, load, tokens_per_s
from poolgate.shared.domain.errors import DeadlineExceeded, Overloaded, Unavailable
from poolgate.shared.domain.lanes import BULK, LIVE, Lane
from poolgate.shared.inputs.front import Front
from poolgate.shared.telemetry.log_limit import LogLimiter
from poolgate.shared.wire.messages import ModelInfo, PoolingResult
from poolgate.shared.wire.token_call import TokenCall

__all__ = ["AdmissionLimits", "Client", "Job", "Member", "State", "WorkerPool"]

log = logging.getLogger("poolgate.gateway.pools.pool")
_retries = LogLimiter(log)  # one line per worker and cause per window, not one per call


class WorkerPool:
    """Sends each job to the ready member with the fewest outstanding tokens (module doc).

    ``limits`` are its admission (``gateway.pools.admission``); ``max_in_flight``
    is a shorthand for ``AdmissionLimits(max_calls_per_worker=...)``. ``ready=False``
    starts the given clients ``down`` (a probe or ``mark_ready`` brings them in).
    """

    def __init__(
        self,
        model_info: ModelInfo,
        clients: Sequence[Client],
        *,
        limits: AdmissionLimits | None = None,
        max_in_flight: int | None = None,
        ready: bool = True,
        front: Front | None = None,
    ) -> None:
        if not clients:
            raise ValueError("a WorkerPool needs at least one client")
        if max_in_flight is not None:
            if limits is not None:
                raise ValueError("give either limits or max_in_flight")
            limits = AdmissionLimits(max_calls_per_worker=max_in_flight)
        self.info = model_info
        self.front = front  # the model's tokenizer and input shaping (None: not known yet)
        self.loras: dict[str, str] = {}  # run-time LoRA adapters its workers hold, name -> folder (pools.loras)
        self.admission = Admission(limits, model=model_info.served_model_name)
        self.draining = False  # set by ``drain``: the gateway is shutting down
        self._said_empty = False  # "no ready worker" is logged (once per outage, until one is back)
        self._calls = 0
        self._picks = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._members: dict[int, Member] = {}
        for client in clients:
            self.add(client, state="ready" if ready else "down")

    @property
    def max_in_flight(self) -> int | None:
        return self.admission.limits.max_calls_per_worker

    @property
    def name(self) -> str:
        return self.info.served_model_name

    @property
    def clients(self) -> list[Client]:
        return [m.client for m in self._members.values()]

    @property
    def ready(self) -> bool:
        return not self.draining and any(m.state == "ready" for m in self._members.values())

    def member(self, client: Client) -> Member:
        return self._members[id(client)]

    def state(self, client: Client) -> State:
        return self.member(client).state

    def is_ready(self, client: Client) -> bool:
        return self.member(client).state == "ready"

    def recoveries(self, client: Client) -> int:
        """How often ``client`` came back after being down or restarted (or not ready at start)."""
        return self.member(client).recoveries

    def in_flight(self, client: Client) -> int:
        return self.member(client).calls

    def outstanding_tokens(self, client: Client) -> int:
        return self.member(client).tokens

    def down_for(self, client: Client) -> float:
        """Seconds ``client`` has been down without a break (0 when it is not down)."""
        member = self.member(client)
        return time.monotonic() - member.since if member.state == "down" else 0.0

    def add(self, client: Client, *, state: State = "ready") -> None:
        """A new member (a discovered or restarted worker); it takes calls at once when ``ready``."""
        if id(client) in self._members:
            raise ValueError(f"worker {client.address} is already in pool '{self.name}'")
        self._members[id(client)] = member = Member(client, state)
        if state != "ready":
            member.lost.set()
            member.error = "not ready yet"

    def set_state(self, client: Client, state: State, error: str | None = None) -> None:
        """Move a member to ``state``. Leaving ``ready`` for ``down`` or ``starting`` makes the calls
        on it fail over; arriving at ``ready`` from ``down`` or ``starting`` counts a recovery."""
        member = self.member(client)
        served = bool(self._ready())
        before, member.state = member.state, state
        if state != before:
            member.since = time.monotonic()
        if state == "ready":
            member.error = None
            member.lost.clear()
            if before in ("down", "starting"):
                member.recoveries += 1
        elif state in ("down", "starting"):
            member.error = error or member.error
            member.lost.set()
            if before == "ready":
                log.warning("worker %s of '%s' is %s: %s", client.address, self.name, state, member.error)
        if served and not self._ready() and not self.draining:  # once per outage, not per call
            self._said_empty = True
            log.warning("pool '%s' has no ready worker: its requests get 503 until one is back", self.name)
        elif self._said_empty and self._ready():
            self._said_empty = False
            log.info("pool '%s' is serving again (%d ready)", self.name, len(self._ready()))

    def mark_ready(self, client: Client, ready: bool = True) -> None:
        self.set_state(client, "ready" if ready else "down")

    def replace(self, old: Client, new: Client) -> None:
        """Put ``new`` in ``old``'s place (a restarted local worker), keeping its recovery count;
        ``new`` is ready. The caller closes ``old``."""
        member = self._members[id(old)]
        member.client = new
        self._members = {id(m.client): m for m in self._members.values()}
        self.set_state(new, "ready")

    async def remove(self, client: Client, *, drain_timeout_s: float = 30.0) -> None:
        """Take ``client`` out: no new calls, wait (up to ``drain_timeout_s``) for its calls, then close it."""
        member = self.member(client)
        member.state = "draining"
        try:
            await asyncio.wait_for(member.idle.wait(), drain_timeout_s)
        except TimeoutError:
            log.warning(
                "worker %s still had %d calls after %ss of draining", client.address, member.calls, drain_timeout_s
            )
        self._members.pop(id(client), None)
        await client.close()

    def snapshot(self) -> list[dict]:
        """Every member's state and load, for the admin API."""
        return [
            {
                "address": m.client.address,
                "state": m.state,
                "calls_in_flight": m.calls,
                "outstanding_tokens": m.tokens,
                "recoveries": m.recoveries,
                "error": m.error,
                "tokens_per_s": m.tokens_per_s,
            }
            for m in self._members.values()
        ]

    async def submit(self, call: TokenCall) -> PoolingResult:
        """The call's result (``run`` of its pooling job)."""
        return await self.run(pooling_job(call))

    async def run(self, job: Job) -> Any:
        """The job's answer from the least-loaded ready worker that may take it; on a lost worker (or one
        whose queue is full), once more on another one; a 504 once its deadline passes (the transport
        then cancels it in the worker)."""
        if self.draining:
            raise Unavailable("The server is shutting down; retry on another instance.")
        member = self._pick(job.lane)
        self.admission.admit(job.tokens, self.capacity(), job.lane)
        try:
            try:
                return await self._send(member, job)
            except (Unavailable, Overloaded) as exc:
                others = [m for m in self._ready() if m is not member]
                if not others or (job.deadline is not None and job.deadline <= time.time()):
                    raise
                retry = min(others, key=lambda m: load(m, job.lane))
                _retries.log(
                    logging.INFO,
                    (member.client.address, str(exc)),
                    "retrying %s on %s after: %s",
                    job.request_id,
                    retry.client.address,
                    exc,
                )
                return await self._send(retry, job)
        finally:
            self.admission.release(job.tokens, job.lane)

    async def _send(self, member: Member, job: Job) -> Any:
        """One attempt on ``member``, counted in its load; Unavailable if it is lost meanwhile."""
        tokens, bulk = job.tokens, job.lane == BULK
        self._picks += 1
        member.picked = self._picks
        member.calls += 1
        member.tokens += tokens
        member.bulk_calls += int(bulk)
        member.bulk_tokens += tokens if bulk else 0
        member.idle.clear()
        self._calls += 1
        self._idle.clear()
        work = asyncio.ensure_future(job.send(member.client))
        lost = asyncio.ensure_future(member.lost.wait())
        timeout = None if job.deadline is None else max(job.deadline - time.time(), 0.0)
        try:
            done, _ = await asyncio.wait({work, lost}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if work in done:
                member.answered = time.monotonic()
                return work.result()
            if lost in done:
                raise Unavailable(f"worker {member.client.address} was lost: {member.error}")
            raise DeadlineExceeded(f"Request {job.request_id} did not finish before its deadline.")
        except Unavailable as exc:
            if member.state == "ready":
                self.set_state(member.client, "down", str(exc))
            raise
        finally:
            for future in (work, lost):
                future.cancel()
            member.calls -= 1
            member.tokens -= tokens
            member.bulk_calls -= int(bulk)
            member.bulk_tokens -= tokens if bulk else 0
            if not member.calls:
                member.idle.set()
            self._calls -= 1
            if not self._calls:
                self._idle.set()

    def capacity(self) -> float:
        """Tokens per second the ready members measured (their last health answers); 0 = not known."""
        return sum(m.tokens_per_s for m in self._ready())

    def _ready(self) -> list[Member]:
        return [m for m in self._members.values() if m.state == "ready"]

    def _pick(self, lane: Lane = LIVE) -> Member:
        ready = self._ready()
        if not ready:
            raise Unavailable(f"No worker is ready to serve model '{self.name}'.")
        return min(self.admission.candidates(ready, calls_in, lane), key=lambda m: load(m, lane))

    async def probe(self, timeout_s: float | None = None) -> None:
        """Health-check every ready or down member at once (each within ``timeout_s``) and set its
        state from the answer: no answer in time, or an error, is down; except that a ready member
        that answered a call while we asked is alive (a busy worker can be slow to answer a check)."""
        asked = time.monotonic()
        members = [m for m in self._members.values() if m.state in ("ready", "down")]
        answers = await asyncio.gather(*(check(m.client, timeout_s) for m in members))
        for member, (error, answer) in zip(members, answers, strict=True):
            if member.state not in ("ready", "down") or self._members.get(id(member.client)) is not member:
                continue  # restarted, removed or draining while we asked
            if error and member.state == "ready" and member.answered >= asked:
                continue
            member.tokens_per_s = tokens_per_s(answer) or member.tokens_per_s
            self.set_state(member.client, "down" if error else "ready", error)

    def drain(self) -> None:
        """Refuse new calls from now on (503); the calls in flight go on."""
        self.draining = True

    async def idle(self) -> None:
        """Return once no call is in flight on any member."""
        await self._idle.wait()

    async def close(self) -> None:
        for member in list(self._members.values()):
            await member.client.close()
