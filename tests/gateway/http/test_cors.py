"""CORS: off unless ``--allowed-origins`` names origins; then their preflights get a 204 and their responses
``Access-Control-Allow-Origin`` (never ``*`` with credentials), other origins nothing."""
from __future__ import annotations

import contextlib

import pytest
from aiohttp.test_utils import TestClient, TestServer

from poolgate.gateway import serve
from poolgate.gateway.app import make_app
from poolgate.gateway.config.build import SettingError
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import fake_model
from tests.gateway.conftest import served_router

KEY = "sekrit"
APP = "https://app.example.com"
PREFLIGHT = {"Origin": APP, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}
EMBED = {"model": "fake-model", "input": "hello world"}


@contextlib.asynccontextmanager
async def app_with(origins: tuple[str, ...] = ()):
    async with served_router([fake_model()]) as router:
        app = make_app(GatewayConfig(api_key=KEY, allowed_origins=origins), router)
        async with TestClient(TestServer(app)) as client:
            yield client


def cors_headers(resp) -> dict:
    return {k: v for k, v in resp.headers.items() if k.lower().startswith("access-control-")}


async def test_without_allowed_origins_there_are_no_cors_headers_and_a_preflight_is_refused():
    async with app_with() as client:
        pre = await client.options("/v1/embeddings", headers=PREFLIGHT)
        assert pre.status == 405 and cors_headers(pre) == {}
        assert (await client.options("/nowhere", headers=PREFLIGHT)).status in (401, 404)
        resp = await client.post("/v1/embeddings", json=EMBED,
                                 headers={"Origin": APP, "Authorization": f"Bearer {KEY}"})
        assert resp.status == 200 and cors_headers(resp) == {}


async def test_an_allowed_origin_gets_its_preflight_and_its_responses_marked():
    async with app_with((APP,)) as client:
        pre = await client.options("/v1/embeddings", headers=PREFLIGHT)  # no key: browsers send none here
        assert pre.status == 204
        h = pre.headers
        assert h["Access-Control-Allow-Origin"] == APP and "POST" in h["Access-Control-Allow-Methods"]
        assert {"Authorization", "Content-Type"} <= set(h["Access-Control-Allow-Headers"].split(", "))
        assert int(h["Access-Control-Max-Age"]) > 0 and "Access-Control-Allow-Credentials" not in h
        assert h["Vary"] == "Origin"
        ok = await client.post("/v1/embeddings", json=EMBED, headers={"Origin": APP, "Authorization": f"Bearer {KEY}"})
        assert ok.status == 200 and ok.headers["Access-Control-Allow-Origin"] == APP
        assert "Retry-After" in ok.headers["Access-Control-Expose-Headers"]
        refused = await client.post("/v1/embeddings", json=EMBED, headers={"Origin": APP})
        assert refused.status == 401 and refused.headers["Access-Control-Allow-Origin"] == APP  # readable error
        assert (await client.options("/nowhere", headers=PREFLIGHT)).status in (401, 404)


async def test_another_origin_gets_nothing_and_a_star_never_comes_with_credentials():
    async with app_with((APP,)) as client:
        evil = {**PREFLIGHT, "Origin": "https://evil.example.com"}
        pre = await client.options("/v1/embeddings", headers=evil)
        assert pre.status == 405 and cors_headers(pre) == {}
        resp = await client.post("/v1/embeddings", json=EMBED, headers={**evil, "Authorization": f"Bearer {KEY}"})
        assert resp.status == 200 and cors_headers(resp) == {}
    async with app_with(("*",)) as client:
        pre = await client.options("/v1/embeddings", headers={**PREFLIGHT, "Origin": "https://any.example"})
        assert pre.status == 204 and pre.headers["Access-Control-Allow-Origin"] == "*"
        assert "Access-Control-Allow-Credentials" not in pre.headers


def parse(*flags: str) -> GatewayConfig:
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    serve.add_arguments(p)
    return serve.config_from_args(p.parse_args(list(flags)), {})


def test_allowed_origins_are_repeatable_or_a_comma_list_and_must_be_origins():
    assert parse().allowed_origins == ()
    got = parse("--allowed-origins", f"{APP}, http://localhost:3000", "--allowed-origins", APP).allowed_origins
    assert got == (APP, "http://localhost:3000")
    for bad in ("app.example.com", "https://app.example.com/", "ftp://x"):
        with pytest.raises(SettingError, match="is not an origin"):
            parse("--allowed-origins", bad)


def test_the_config_file_key_and_its_error_line(tmp_path):
    from poolgate.gateway.config.file import ConfigError, load_config
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    serve.add_arguments(p)
    path = tmp_path / "serve.toml"
    path.write_text(f'allowed_origins = ["{APP}"]\n[[models]]\n')
    assert load_config(str(path), p, {}).allowed_origins == (APP,)
    path.write_text('port = 1\nallowed_origins = ["nope"]\n[[models]]\n')
    with pytest.raises(ConfigError, match=r"serve.toml:2: allowed_origins: 'nope' is not an origin"):
        load_config(str(path), p, {})
