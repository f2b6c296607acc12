"""A request that is not an aiohttp one, as the serving path reads it (``gateway.serving.Scope``).

The gRPC server (``gateway.grpc``) runs each call, or each batch of a stream,
through the serving path in a ``CallScope``: the app, the call's metadata as
headers, and the per-request state the HTTP middleware would have put on an
aiohttp request (request id, tenant, telemetry record).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy


class CallScope:
    """A gRPC call (or one batch of a stream) as ``gateway.serving.Scope``: the app, the call's metadata as
    headers, and its own state (request id, tenant, record)."""

    method = "POST"  # (http.middleware.caller reads no more of a request than a scope has)

    def __init__(self, app: web.Application, headers: CIMultiDictProxy[str]) -> None:
        self._app, self._headers = app, headers
        self._state: dict[Any, Any] = {}

    @property
    def app(self) -> web.Application:
        return self._app

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._headers

    def get(self, key: Any, default: Any = None) -> Any:
        return self._state.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        return self._state[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._state[key] = value
