"""Typed keys for the state the app factory puts on the app and each request."""
from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from poolgate.gateway.pools.router import Router
from poolgate.gateway.telemetry.record import RequestRecord, Telemetry
from poolgate.shared.config import GatewayConfig
from poolgate.shared.errors import PoolgateError

ErrorFormatter = Callable[[PoolgateError], dict]

CONFIG = web.AppKey("config", GatewayConfig)
ROUTER = web.AppKey("router", Router)
# Path prefix -> error body builder; the longest matching prefix wins, "" is the default.
ERROR_FORMATTERS = web.AppKey("error_formatters", dict[str, ErrorFormatter])
REQUEST_ID = web.RequestKey("request_id", str)
TELEMETRY = web.AppKey("telemetry", Telemetry)
RECORD = web.RequestKey("record", RequestRecord | None)  # None: not recorded (ops route, telemetry off)
