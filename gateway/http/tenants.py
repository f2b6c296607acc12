"""Who is calling, and whether they may now: API keys to tenants (in constant time) and each tenant's quotas.

The gateway's keys are ``--api-key`` (the tenant ``default``, no quotas, the
only key the admin API takes) and the tenants of ``--api-keys-file``
(``gateway.config.tenants``). Only sha256 digests are held; a sent key is
hashed and compared with every digest (``hmac.compare_digest``, no early exit),
so the answer's timing says nothing about which key, if any, matched.

A tenant's quotas, checked when a request arrives (``admit``), charged with
the request's tokens once the gateway's tokenizer counted them, before it is
queued (``take_tokens``), and released when it ends (``leave``):

- ``max_concurrent``: requests in flight at once;
- ``requests_per_minute`` and ``tokens_per_minute``: token buckets holding a
  minute's worth, refilled continuously. A request needs one request, and its
  counted tokens in the bucket (one bigger than a minute's quota needs a full
  bucket and leaves it in debt); requests in flight together each take their
  own. A request the pools then refuse before it ran (429) gets its tokens
  back (``give_back``); one that ran, or failed while running, keeps its charge.

Over a quota: ``Overloaded`` (429) with a ``Retry-After`` of when the bucket
has enough again, the reason ``tenant_concurrency`` / ``tenant_requests`` /
``tenant_tokens``, and one log line per tenant and reason until it is under
its quota again.

With ``--gateway-processes N`` the buckets and the counts in flight are the
same numbers in every process (``gateway.http.quota_cells``), each checked and
taken in one locked step, so a tenant's quota holds across the processes.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from poolgate.gateway.http.quota_cells import Cells, Floats, LocalCells, Tally
from poolgate.shared.config.frozen import GatewayConfig, Tenant
from poolgate.shared.domain.errors import Overloaded

log = logging.getLogger("poolgate.gateway.tenants")

DEFAULT_TENANT = "default"  # the --api-key's tenant


class Bucket:
    """``per_minute`` units, refilled continuously; may go into debt (``take`` past zero). Its level and time
    are two cells (``gateway.http.quota_cells``: this process's own, or shared by the gateway processes)."""

    def __init__(
        self,
        per_minute: int,
        clock: Callable[[], float] = time.monotonic,
        cells: Cells | None = None,
        slot: int = 0,
    ) -> None:
        self.capacity, self.rate, self.clock = float(per_minute), per_minute / 60.0, clock
        self.cells, self.slot = cells or LocalCells(2), slot
        if self.cells.fresh:
            with self.cells.locked() as v:
                v[slot], v[slot + 1] = self.capacity, clock()

    @property
    def level(self) -> float:
        with self.cells.locked() as v:
            return v[self.slot]

    def _refilled(self, v: Floats) -> float:
        now, level, at = self.clock(), v[self.slot], v[self.slot + 1]
        v[self.slot], v[self.slot + 1] = min(self.capacity, level + (now - at) * self.rate), now
        return v[self.slot]

    def refill(self) -> float:
        with self.cells.locked() as v:
            return self._refilled(v)

    def wait_s(self, need: float) -> float:
        """Seconds until the bucket holds ``need`` (0 if it does now)."""
        return max(0.0, (need - self.refill()) / self.rate)

    def take(self, n: float) -> None:
        with self.cells.locked() as v:
            self._refilled(v)
            v[self.slot] -= n

    def take_if(self, n: float, need: float | None = None) -> float:
        """Take ``n`` if the bucket holds ``need`` (default: ``n``; 0.0), else take nothing: the seconds until it
        will. One step, so two gateway processes cannot both take the last units."""
        need = n if need is None else need
        with self.cells.locked() as v:
            level = self._refilled(v)
            if level >= need:
                v[self.slot] = level - n
                return 0.0
            return (need - level) / self.rate


@dataclass(eq=False)
class TenantState:
    """One tenant's quotas and what it has in flight."""

    tenant: Tenant
    admin: bool = False  # the --api-key's tenant: the admin API's key
    requests: Bucket | None = None
    tokens: Bucket | None = None
    in_flight: Tally = field(default_factory=Tally)  # requests in flight (shared by the gateway processes)
    logged: set = field(default_factory=set)  # reasons already logged while over quota

    @property
    def name(self) -> str:
        return self.tenant.name

    def admit(self) -> None:
        """Count one request in, or refuse it (module doc); each quota is checked and taken in one step."""
        cap = self.tenant.max_concurrent
        if not self.in_flight.enter(cap):
            self._refuse("tenant_concurrency", f"{cap} requests in flight at once", 1.0)
        try:
            self._check_tokens()
            if self.requests is not None and (wait := self.requests.take_if(1)):
                self._refuse("tenant_requests", f"{self.tenant.requests_per_minute} requests per minute", wait)
        except Overloaded:
            self.in_flight.leave()
            raise
        self.logged.clear()

    def take_tokens(self, tokens: int) -> None:
        """Charge a request's counted ``tokens``, or refuse it (429 naming them) when the bucket does not hold
        them (module doc)."""
        if self.tokens is None:
            return
        if wait := self.tokens.take_if(tokens, need=min(float(tokens), self.tokens.capacity)):
            self._refuse(
                "tenant_tokens",
                f"{self.tenant.tokens_per_minute} tokens per minute (this request has {tokens} tokens)",
                wait,
            )

    def give_back(self, tokens: int) -> None:
        """A request charged ``tokens`` was refused before it ran (module doc)."""
        if self.tokens is not None:
            self.tokens.take(-tokens)

    def _check_tokens(self) -> None:
        if self.tokens is not None and self.tokens.refill() < 0:
            self._refuse("tenant_tokens", f"{self.tenant.tokens_per_minute} tokens per minute", self.tokens.wait_s(0))

    def leave(self) -> None:
        """One admitted request ended."""
        self.in_flight.leave()

    def _refuse(self, reason: str, quota: str, wait_s: float) -> None:
        if reason not in self.logged:
            self.logged.add(reason)
            log.warning("tenant %s is over its quota of %s (429 until it is under it again)", self.name, quota)
        raise Overloaded(
            f"Tenant '{self.name}' is over its quota of {quota}; retry later.",
            retry_after_s=float(min(60, max(1, math.ceil(wait_s)))),
            reason=reason,
        )


CELLS_PER_TENANT = 5  # its requests bucket (level, time), its tokens bucket (level, time), its requests in flight


class Tenants:
    """Every key's tenant (module doc); ``enabled`` is False when the gateway has no key at all. ``cells``: where
    the quotas' numbers live (``CELLS_PER_TENANT`` per tenant of the keys file, in its order; default: here)."""

    def __init__(
        self, config: GatewayConfig, clock: Callable[[], float] = time.monotonic, cells: Cells | None = None
    ) -> None:
        self.states: list[TenantState] = []
        self._keys: list[tuple[bytes, TenantState]] = []
        if config.api_key:
            main = TenantState(
                Tenant(DEFAULT_TENANT, (hashlib.sha256(config.api_key.encode()).hexdigest(),)), admin=True
            )
            self._add(main)
        cells = cells or LocalCells(CELLS_PER_TENANT * len(config.tenants))
        for i, tenant in enumerate(config.tenants):
            at = CELLS_PER_TENANT * i
            self._add(
                TenantState(
                    tenant,
                    requests=_bucket(tenant.requests_per_minute, clock, cells, at),
                    tokens=_bucket(tenant.tokens_per_minute, clock, cells, at + 2),
                    in_flight=Tally(cells, at + 4),
                )
            )

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def identify(self, key: str) -> TenantState | None:
        """The tenant whose key is ``key``, or None; every digest is compared, whatever matches."""
        sent = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        found = None
        for digest, state in self._keys:
            if hmac.compare_digest(sent, digest):
                found = state
        return found

    def _add(self, state: TenantState) -> None:
        self.states.append(state)
        self._keys += [(bytes.fromhex(d), state) for d in state.tenant.key_sha256]


def _bucket(per_minute: int | None, clock: Callable[[], float], cells: Cells, slot: int) -> Bucket | None:
    return None if per_minute is None else Bucket(per_minute, clock, cells, slot)
