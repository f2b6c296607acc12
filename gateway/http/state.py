"""Typed keys for the state the app factory puts on the app and each request."""

from __future__ import annotations

from aiohttp import web

from poolgate.gateway.http.tenants import Tenants, TenantState
from poolgate.gateway.pools.router import Router
from poolgate.gateway.telemetry.record import RequestRecord, Telemetry
from poolgate.shared.config.frozen import GatewayConfig

CONFIG = web.AppKey("config", GatewayConfig)
ROUTER = web.AppKey("router", Router)
# aiohttp's route (a request's ``match_info.route``) -> the ``dialects.route.Route`` mounted as it.
ROUTE_OF = web.AppKey("route_of", dict)
REQUEST_ID = web.RequestKey("request_id", str)
# On a path two dialects share: the route the body's shape picked (its error shape answers; dialects.route).
CHOSEN = web.RequestKey("chosen", object)
TELEMETRY = web.AppKey("telemetry", Telemetry)
RECORD = web.RequestKey[RequestRecord | None]("record")  # None: not recorded (ops route, telemetry off)
TENANTS = web.AppKey("tenants", Tenants)  # every API key's tenant (http.tenants)
# set: the pools' admission refusing this request is waited out (polled every ``serving.PACE_S``) instead of a 429;
# a gRPC stream's batches (gateway.grpc.handlers), whose stream is not read meanwhile
PACED = web.RequestKey("paced", bool)
TENANT = web.RequestKey[TenantState | None]("tenant")  # the caller's; None: no key needed (public, auth off)
