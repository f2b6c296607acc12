"""The operational routes: model list, health, readiness ping and version."""

from __future__ import annotations

import time

from aiohttp import web

from poolgate.gateway.dialects.route import Route
from poolgate.gateway.http.state import ROUTER
from poolgate.shared.domain.errors import Unavailable
from poolgate.shared.version import VERSION
from poolgate.shared.wire.messages import ModelInfo


def model_card(info: ModelInfo, created: int) -> dict:
    """One entry of ``/v1/models`` in vLLM's shape, plus ``worker``: where the model runs (its pool's
    first worker: backend, device, dtype, attention path, each op's kernel (and on a CPU its class), memory in
    bytes once loaded)."""
    return {
        "id": info.served_model_name,
        "object": "model",
        "created": created,
        "owned_by": "poolgate",
        "root": info.served_model_name,
        "parent": None,
        "max_model_len": info.max_model_len,
        "permission": [],
        "worker": {
            "backend": info.backend,
            "device": info.device,
            "device_name": info.device_name,
            "dtype": info.dtype,
            "attention": info.attention,
            "kernels": info.kernels or {},
            "memory": info.device_memory or {},
        },
    }


async def list_models(request: web.Request, _body: None = None) -> web.Response:
    created = int(time.time())
    router = request.app[ROUTER]
    cards = [
        {**model_card(model.info, created), "backends": model.backends}  # its pools, in preference order
        for model in list(router.pools.values())
    ]
    cards += [  # each run-time LoRA adapter (gateway.pools.loras): vLLM's card, its folder and base model
        {
            **model_card(router.pools[card.parent].info, created),
            "id": card.name,
            "root": card.path,
            "parent": card.parent,
            "backends": router.pools[card.parent].backends,
        }
        for card in list(router.loras.values())
        if card.parent in router.pools
    ]
    return web.json_response({"object": "list", "data": cards})


async def health(request: web.Request, _body: None = None) -> web.Response:
    """200 with an empty body once every pool has a ready worker, else 503."""
    if not request.app[ROUTER].ready:
        raise Unavailable("Not ready: some model has no ready worker yet.")
    return web.Response(status=200)


async def version(request: web.Request, _body: None = None) -> web.Response:
    return web.json_response({"version": VERSION})


# Not recorded, as vLLM does not record them; /v1/models needs the API key like the rest of /v1, the probes do not.
ROUTES = (
    Route("GET", "/v1/models", list_models, summary="The served models", recorded=False),
    Route(
        "GET",
        "/health",
        health,
        summary="200 once every model has a ready worker, else 503",
        public=True,
        recorded=False,
        quiet_503=True,
    ),
    Route("GET", "/ping", health, summary="Same as /health (SageMaker)", public=True, recorded=False, quiet_503=True),
    Route("POST", "/ping", health, summary="Same as /health (SageMaker)", public=True, recorded=False, quiet_503=True),
    Route("GET", "/version", version, summary="The poolgate version", public=True, recorded=False),
)
