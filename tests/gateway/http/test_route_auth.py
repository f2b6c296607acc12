"""Every route of the table (each dialect, ops, admin, /metrics, /openapi.json, /docs) refuses a missing API key
unless it is public, in its own error shape; the public ones are exactly the probes, the version, the metrics, the
API document and its Swagger UI page."""
from __future__ import annotations

import contextlib
import re

from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway.app import make_app
from poolgate.gateway.dialects import all_routes
from poolgate.gateway.dialects.oip import ROUTES as OIP_ROUTES
from poolgate.gateway.http.errors import ERROR_FORMATS
from poolgate.gateway.http.state import ROUTE_OF
from poolgate.gateway.telemetry.metrics import GatewayMetrics
from poolgate.gateway.admin import ROUTES as ADMIN_ROUTES
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.domain.errors import Unauthorized
from tests.fakes import fake_model
from tests.gateway.conftest import served_router

PUBLIC = {("GET", "/health"), ("GET", "/ping"), ("POST", "/ping"), ("GET", "/version"), ("GET", "/metrics"),
          ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/{name}"),
          ("GET", "/v2"), ("GET", "/v2/health/live"), ("GET", "/v2/health/ready")}  # the OIP's probes and version
UNRECORDED = {("GET", "/health"), ("GET", "/ping"), ("POST", "/ping"), ("GET", "/version"), ("GET", "/metrics"),
              ("GET", "/v1/models"), ("GET", "/docs"), ("GET", "/docs/{name}")} | {
              (r.method, r.path) for r in OIP_ROUTES if not r.path.endswith("/infer")}  # the OIP's but inference
KEY = "sekrit"


@contextlib.asynccontextmanager
async def keyed_app():
    """The app ``poolgate serve --api-key`` builds (metrics on the API port), over one fake model."""
    async with served_router([fake_model()]) as router:
        app = make_app(GatewayConfig(api_key=KEY), router)
        GatewayMetrics(router).add_route(app)
        async with TestClient(TestServer(app)) as client:
            yield client


def concrete(path: str) -> str:
    return re.sub(r"{(\w+)(:[^}]*)?}", lambda m: "some-model" if m[1] == "name" else f"some-{m[1]}", path)


async def test_every_route_is_in_the_table_and_every_guarded_one_refuses_a_missing_key():
    async with keyed_app() as client:
        table = client.app[ROUTE_OF]
        assert set(client.app.router.routes()) == set(table)  # nothing mounted around the table
        routes = list(table.values())
        assert {(r.method, r.path) for r in [*all_routes(), *ADMIN_ROUTES]} <= {(r.method, r.path) for r in routes}
        assert {(r.method, r.path) for r in routes if r.public} == PUBLIC
        assert {(r.method, r.path) for r in routes if not r.recorded} == UNRECORDED  # the rest: metrics and spans
        for route in routes:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                resp = await client.request(route.method, concrete(route.path), json={}, headers=headers)
                if route.public:
                    assert resp.status != 401, route.path
                    break
                assert resp.status == 401, (route.method, route.path, headers)
                want = ERROR_FORMATS[route.errors](Unauthorized("Unauthorized: missing or invalid API key."))
                assert await resp.json() == want, route.path
            resp = await client.request(route.method, concrete(route.path), json={},
                                        headers={"Authorization": f"Bearer {KEY}"})
            assert resp.status != 401, route.path


async def test_a_route_added_to_a_dialect_is_guarded_by_default():
    from poolgate.gateway.dialects.route import Route

    assert Route("POST", "/embed", None).public is False
    assert Route("POST", "/embed", None).recorded is True
