"""A caller only this process can be: the Batch API's runner, sending a batch's lines as the batch's tenant.

The runner (``gateway.jobs.runner``) sends every line as the HTTP request it
describes, to this gateway's own routes, so the line goes through the same
middleware, tenant quotas, admission, spans and metrics as a live request. It
proves who it is with two headers: ``X-Poolgate-Job-Token``, a random secret
made when the app is (``secrets``, 256 bits, held only in this process's
memory, never written or logged), and ``X-Poolgate-Job-Tenant``, the name of
the tenant the batch belongs to. The middleware (``http.middleware``) takes the
pair on any site: a token that matches (``hmac.compare_digest``) makes the
request that tenant's, its quotas included; a token that does not, or a tenant
the keys no longer name, is a 401 like a wrong key. Another gateway process
(``--gateway-processes N``) has its own secret, so a token is good only where
it was made.
"""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING

from aiohttp import web

from poolgate.gateway.http.tenants import Tenants, TenantState
from poolgate.shared.domain.errors import Unauthorized

if TYPE_CHECKING:
    from poolgate.gateway.serving import Scope

TOKEN_HEADER = "X-Poolgate-Job-Token"
TENANT_HEADER = "X-Poolgate-Job-Tenant"


class TrustedCaller:
    """This process's secret, and the tenants a request presenting it acts as."""

    def __init__(self) -> None:
        self._token = secrets.token_urlsafe(32)

    def headers(self, tenant: str) -> dict[str, str]:
        """The headers of a request sent as ``tenant``'s (only this process's runner calls this)."""
        return {TOKEN_HEADER: self._token, TENANT_HEADER: tenant}

    def tenant_of(self, request: Scope, tenants: Tenants) -> TenantState | None:
        """The tenant a request acts as when it carries the token; None without the header; 401 for a wrong
        token or a tenant no key names."""
        sent = request.headers.get(TOKEN_HEADER)
        if sent is None:
            return None
        if not hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), self._token.encode()):
            raise Unauthorized("Unauthorized: invalid job token.")
        name = request.headers.get(TENANT_HEADER, "")
        state = next((s for s in tenants.states if s.name == name), None)
        if state is None:
            raise Unauthorized(f"Unauthorized: no tenant named {name!r} (a batch of a tenant whose keys are gone).")
        return state


TRUSTED = web.AppKey("trusted", TrustedCaller)  # set by make_app when the Batch API is on
