"""vLLM's run-time LoRA routes: ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (admin-guarded).

``load``: ``{lora_name, lora_path, base_model_name?}``; ``lora_path`` is a folder
under one of the server's model roots (relative to a root, or absolute; resolved
before the check, as the admin API's ``model``: 403 outside them, 403 with no
roots), holding a PEFT LoRA adapter (``adapter_config.json`` +
``adapter_model.safetensors``). The answer is vLLM's: 200, plain text ``Success:
LoRA adapter '<name>' added successfully.``; 400 for a missing field, a name that
is a served base model's or already loaded, or an adapter the base model's
workers refuse (the reason named: ``workers.models.run_loras``). ``load_inplace``
(vLLM's: replace a loaded adapter) is refused: unload it first.
``unload``: ``{lora_name}``; 200 text, 404 when it is not loaded.

Like the admin API (``gateway.admin``) these need the server's API key and are
off (403) without one: they make workers read folders. How adapters are routed
is ``gateway.pools.loras``'s.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from poolgate.gateway.admin import check_enabled, under_roots
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.http.state import CONFIG, ROUTER
from poolgate.gateway.pools import loras
from poolgate.shared.domain.errors import InvalidRequest


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_path: str
    base_model_name: str | None = None  # poolgate: which served model it adapts (default: the only one)
    load_inplace: bool = False  # vLLM's; only False (unload first)


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_int_id: int | None = None  # vLLM's; the name decides


async def load_adapter(request: web.Request, body: LoadLoraAdapterRequest) -> web.Response:
    check_enabled(request)
    if body.load_inplace:
        raise InvalidRequest(
            "load_inplace: replacing a loaded adapter is not supported; unload it first", param="load_inplace"
        )
    if not body.lora_name:
        raise InvalidRequest("lora_name must not be empty", param="lora_name")
    path = under_roots(body.lora_path, request.app[CONFIG].model_roots)
    card = await loras.load(request.app[ROUTER], body.lora_name, path, body.base_model_name)
    return web.Response(text=f"Success: LoRA adapter '{card.name}' added successfully.")


async def unload_adapter(request: web.Request, body: UnloadLoraAdapterRequest) -> web.Response:
    check_enabled(request)
    card = await loras.unload(request.app[ROUTER], body.lora_name)
    return web.Response(text=f"Success: LoRA adapter '{card.name}' removed successfully.")


ROUTES = (
    Route(
        "POST",
        "/v1/load_lora_adapter",
        load_adapter,
        LoadLoraAdapterRequest,
        admin=True,
        summary="Load a LoRA adapter from the model roots onto its base model's workers (admin)",
    ),
    Route(
        "POST",
        "/v1/unload_lora_adapter",
        unload_adapter,
        UnloadLoraAdapterRequest,
        admin=True,
        summary="Unload a LoRA adapter (admin)",
    ),
)
