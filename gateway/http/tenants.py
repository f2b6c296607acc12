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
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from poolgate.shared.config import GatewayConfig, Tenant
from poolgate.shared.errors import Overloaded

log = logging.getLogger("poolgate.gateway.tenants")

DEFAULT_TENANT = "default"  # the --api-key's tenant


class Bucket:
    """``per_minute`` units, refilled continuously; may go into debt (``take`` past zero)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity, self.rate, self.clock = float(per_minute), per_minute / 60.0, clock
        self.level, self.at = self.capacity, clock()

    def refill(self) -> float:
        now = self.clock()
        self.level, self.at = min(self.capacity, self.level + (now - self.at) * self.rate), now
        return self.level

    def wait_s(self, need: float) -> float:
        """Seconds until the bucket holds ``need`` (0 if it does now)."""
        return max(0.0, (need - self.refill()) / self.rate)

    def take(self, n: float) -> None:
        self.refill()
        self.level -= n


@dataclass(eq=False)
class TenantState:
    """One tenant's quotas and what it has in flight."""

    tenant: Tenant
    admin: bool = False  # the --api-key's tenant: the admin API's key
    requests: Bucket | None = None
    tokens: Bucket | None = None
    in_flight: int = 0
    logged: set = field(default_factory=set)  # reasons already logged while over quota

    @property
    def name(self) -> str:
        return self.tenant.name

    def admit(self) -> None:
        """Count one request in, or refuse it (module doc)."""
        cap = self.tenant.max_concurrent
        if cap is not None and self.in_flight >= cap:
            self._refuse("tenant_concurrency", f"{cap} requests in flight at once", 1.0)
        if self.requests is not None and self.requests.wait_s(1):
            self._refuse(
                "tenant_requests", f"{self.tenant.requests_per_minute} requests per minute", self.requests.wait_s(1)
            )
        self._check_tokens()
        if self.requests is not None:
            self.requests.take(1)
        self.in_flight += 1
        self.logged.clear()

    def take_tokens(self, tokens: int) -> None:
        """Charge a request's counted ``tokens``, or refuse it (429 naming them) when the bucket does not hold
        them (module doc)."""
        if self.tokens is None:
            return
        need = min(float(tokens), self.tokens.capacity)
        if self.tokens.refill() < need:
            self._refuse(
                "tenant_tokens",
                f"{self.tenant.tokens_per_minute} tokens per minute (this request has {tokens} tokens)",
                self.tokens.wait_s(need),
            )
        self.tokens.take(tokens)

    def give_back(self, tokens: int) -> None:
        """A request charged ``tokens`` was refused before it ran (module doc)."""
        if self.tokens is not None:
            self.tokens.take(-tokens)

    def _check_tokens(self) -> None:
        if self.tokens is not None and self.tokens.refill() < 0:
            self._refuse("tenant_tokens", f"{self.tenant.tokens_per_minute} tokens per minute", self.tokens.wait_s(0))

    def leave(self) -> None:
        """One admitted request ended."""
        self.in_flight -= 1

    def _refuse(self, reason: str, quota: str, wait_s: float) -> None:
        if reason not in self.logged:
            self.logged.add(reason)
            log.warning("tenant %s is over its quota of %s (429 until it is under it again)", self.name, quota)
        raise Overloaded(
            f"Tenant '{self.name}' is over its quota of {quota}; retry later.",
            retry_after_s=float(min(60, max(1, math.ceil(wait_s)))),
            reason=reason,
        )


class Tenants:
    """Every key's tenant (module doc); ``enabled`` is False when the gateway has no key at all."""

    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.states: list[TenantState] = []
        self._keys: list[tuple[bytes, TenantState]] = []
        if config.api_key:
            main = TenantState(
                Tenant(DEFAULT_TENANT, (hashlib.sha256(config.api_key.encode()).hexdigest(),)), admin=True
            )
            self._add(main)
        for tenant in config.tenants:
            self._add(
                TenantState(
                    tenant,
                    requests=_bucket(tenant.requests_per_minute, clock),
                    tokens=_bucket(tenant.tokens_per_minute, clock),
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


def _bucket(per_minute: int | None, clock: Callable[[], float]) -> Bucket | None:
    return None if per_minute is None else Bucket(per_minute, clock)
