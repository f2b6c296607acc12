"""IO-processor plugins on ``POST /pooling`` (vLLM's ``plugin`` task): a custom request in, a custom response out.

A plugin is a Python entry point in the group ``poolgate.io_processor_plugins``
whose object, called with no arguments, gives an ``IOProcessor``: ``task`` (the
pooling task its inputs run as), ``to_inputs(data)`` (the request's ``data`` →
texts or token-id lists; it raises ``shared.domain.errors.InvalidRequest`` for data it
cannot take) and ``to_response(data, outputs)`` (the request's ``data`` and one
array per input → the response's ``data``, JSON-ready). The server runs the one
that ``--io-processor-plugin NAME`` (or ``io_processor_plugin`` in the config
file) names; a ``/pooling`` body with ``data`` and no ``input`` / ``messages``
is a plugin request. Without a plugin, such a request gets vLLM's 400
``No IOProcessor plugin installed.``; an ``input`` body with ``task: "plugin"``
gets vLLM's ``Unsupported task: 'plugin' …`` on a model without that task,
before any plugin check (``vllm_pooling.pooling_task``). Plugins run in the
gateway, which imports no torch (a plugin may import what it likes).
``examples/io_processor_plugin`` ships one: sentence similarity.
"""

from __future__ import annotations

import time
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from poolgate.gateway.dialects.envelope import usage
from poolgate.gateway.dialects.route import Route
from poolgate.gateway.http.state import CONFIG
from poolgate.gateway.serving import ServeRequest, serve
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.tasks import PoolingTask

ENTRY_POINT_GROUP = "poolgate.io_processor_plugins"
NO_PLUGIN = "No IOProcessor plugin installed."


class IOProcessor(Protocol):
    task: PoolingTask

    def to_inputs(self, data: Any) -> list[str | list[int]]: ...

    def to_response(self, data: Any, outputs: list) -> Any: ...


def installed() -> dict[str, Any]:
    """name → entry point, for every plugin installed in this environment."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


@cache
def load_plugin(name: str) -> IOProcessor:
    """The plugin ``name`` (ValueError naming what is installed when it is not)."""
    found = installed()
    if name not in found:
        raise ValueError(
            f"--io-processor-plugin {name!r} is not installed (entry point group {ENTRY_POINT_GROUP}; "
            f"installed: {', '.join(sorted(found)) or 'none'})"
        )
    return found[name].load()()


def plugin_of(request: web.Request) -> IOProcessor:
    name = request.app[CONFIG].io_processor_plugin
    if name is None:
        raise InvalidRequest(NO_PLUGIN)
    return load_plugin(name)


def is_plugin_body(raw: object) -> bool:
    """A ``/pooling`` body the plugin route takes: ``data`` without ``input`` or ``messages``."""
    return isinstance(raw, dict) and "data" in raw and "input" not in raw and "messages" not in raw


class IOProcessorRequest(BaseModel):
    """vLLM's IOProcessorRequest: the plugin's ``data``; other fields are allowed and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    data: Any
    priority: int = 0


async def create_plugin_pooling(request: web.Request, req: IOProcessorRequest) -> web.Response:
    plugin = plugin_of(request)
    call = ServeRequest(
        model=req.model,
        inputs=list(plugin.to_inputs(req.data)),
        params=PoolingParams(task=plugin.task),
        priority=req.priority,
    )
    served = await serve(request, call)
    rows = served.result.outputs
    data = plugin.to_response(req.data, [rows.item(i) for i in range(len(rows))])
    return web.json_response(
        {
            "id": f"pooling-{served.request_id}",
            "object": "io_processor",
            "created": int(time.time()),
            "model": served.info.served_model_name,
            "data": data,
            "usage": usage(served.result.total_tokens),
        }
    )


ROUTES = (
    Route(
        "POST",
        "/pooling",
        create_plugin_pooling,
        IOProcessorRequest,
        shape=is_plugin_body,
        summary="an IO-processor plugin's request and response (--io-processor-plugin)",
    ),
)
