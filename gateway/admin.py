"""The admin API: list pools and workers, load a model from the model roots, unload one (draining first).

Routes (errors in the OpenAI error shape):

- ``GET /admin/pools``: every model, its pools in preference order (backend,
  dtype, admission cap) and each pool's workers (address, state: starting /
  ready / down / draining, calls in flight, outstanding tokens, recoveries),
  as the gateway process that answers sees them (``pid``: which one, with
  ``--gateway-processes N``: its own calls and admission, the same workers);
- ``POST /admin/models``: a JSON object with the keys of a config file's
  ``[[models]]`` table (``name``, ``model``, ``backend``, ``replicas``,
  ``devices``, ``dtype``, ``pooler_config``, ...; no ``remote``). ``model`` is a
  folder under one of the server's model roots (``model_roots`` /
  ``--model-root``): relative to a root, or absolute; it is resolved (symlinks,
  ``..``) before the check, so nothing outside the roots is ever loaded. The
  answer (201) comes once the model's workers are ready and it is served;
  a model already served is 409;
- ``DELETE /admin/models/{name}``: stop routing to it (404 from then on), let
  its calls in flight finish (up to ``drain_timeout_s``), stop its workers.

Security: the admin API needs the API key (``Authorization: Bearer``; its routes
are not ``public``, so the middleware checks it as on every API route), and is OFF (403) when the server has no API key:
it starts processes and reads folders, so it is never open to anyone who can
reach the port. Loading is also off (403) without model roots.
"""

from __future__ import annotations

import os
from pathlib import Path

from aiohttp import web

from poolgate.gateway.config.build import SettingError, pool_config
from poolgate.gateway.config.file import dotted, model_entry
from poolgate.gateway.dialects.body import JSON_MEDIA_TYPE
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.http.state import CONFIG, ROUTER
from poolgate.gateway.pools.fleet import Fleet
from poolgate.shared.domain.errors import Forbidden, InvalidRequest, Unavailable

FLEET = web.AppKey("fleet", Fleet)
# Keys a request may not set, and why: the gateway dials only what its config names, and code execution
# (remote code, pickles) is the operator's decision, made in the config, never a request's.
NOT_LOADABLE = {
    "remote": "remote workers come from the server's config, not a request",
    "trust_remote_code": "running a checkpoint's own code can only be allowed in the server's config",
    "allow_pickle_weights": "pickle weights can only be allowed in the server's config",
    "allow_partial_weights": "serving a partly loaded checkpoint can only be allowed in the server's config",
}
MAX_REPLICAS = os.cpu_count() or 1  # local workers one request may start


def check_enabled(request: web.Request) -> None:
    if not request.app[CONFIG].api_key:
        raise Forbidden("The admin API is disabled: the server has no API key (--api-key / api_key).")


def under_roots(model: object, roots: tuple[str, ...]) -> str:
    """The real folder ``model`` names inside one of ``roots``; Forbidden (403) otherwise."""
    if not roots:
        raise Forbidden("Loading models is disabled: the server has no model roots (--model-root / model_roots).")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: a folder under a model root is required", param="model")
    for root in map(Path, roots):
        try:
            candidate = (root / model).resolve()
            found = candidate.is_relative_to(root) and candidate.is_dir()
        except (OSError, ValueError):  # a name no folder can have (a NUL byte, too long): not under the roots
            found = False
        if found:
            return str(candidate)
    raise Forbidden(f"model {model!r} is not a folder under the server's model roots.", param="model")


def fleet_of(request: web.Request) -> Fleet:
    fleet = request.app.get(FLEET)
    if fleet is None:
        raise Unavailable("This gateway does not manage workers; it cannot load or unload models.")
    return fleet


async def list_pools(request: web.Request, _body: None = None) -> web.Response:
    check_enabled(request)
    router = request.app[ROUTER]
    data = [
        {
            "id": name,
            "object": "model",
            "default": name == router.default,
            "ready": model.ready,
            "tasks": list(model.info.tasks),
            "pools": model.snapshot(),
        }
        for name, model in list(router.pools.items())
    ]
    return web.json_response({"object": "list", "pid": os.getpid(), "data": data})  # this gateway process's view


async def load_model(request: web.Request, _body: None = None) -> web.Response:
    check_enabled(request)
    config = request.app[CONFIG]
    body = await _json_object(request)
    for key, why in NOT_LOADABLE.items():
        if key in body:
            raise InvalidRequest(f"{key}: {why}", param=key)
    replicas = body.get("replicas")
    if isinstance(replicas, int) and replicas > MAX_REPLICAS:
        raise InvalidRequest(
            f"replicas: a request may start at most {MAX_REPLICAS} workers (this machine's "
            "cores); more come from the server's config",
            param="replicas",
        )
    table = {**body, "model": under_roots(body.get("model"), config.model_roots)}
    try:
        pool = pool_config(model_entry(table), config.tracing)
    except SettingError as exc:  # a key of the body, named
        key = dotted(exc.path)
        raise InvalidRequest(f"{key}: {exc}" if key else str(exc), param=key or None) from None
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    names = await fleet_of(request).start([pool])
    model = request.app[ROUTER].pools[names[0]]
    return web.json_response({"id": model.name, "object": "model", "pools": model.snapshot()}, status=201)


async def unload_model(request: web.Request, _body: None = None) -> web.Response:
    check_enabled(request)
    name = request.match_info["name"]
    await fleet_of(request).unload(name, request.app[CONFIG].drain_timeout_s)
    return web.json_response({"id": name, "object": "model", "deleted": True})


async def _json_object(request: web.Request) -> dict:
    if request.content_type != JSON_MEDIA_TYPE:
        raise InvalidRequest("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        body = await request.json()
    except ValueError as exc:
        raise InvalidRequest(f"Malformed JSON in request body: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object (the keys of a [[models]] table).")
    return body


ROUTES = (
    Route(
        "GET", "/admin/pools", list_pools, admin=True, summary="Every model's pools and workers: state and load (admin)"
    ),
    Route(
        "POST",
        "/admin/models",
        load_model,
        admin=True,
        summary="Load a model from the model roots and serve it (admin)",
    ),
    Route("DELETE", "/admin/models/{name}", unload_model, admin=True, summary="Drain and unload a model (admin)"),
)
