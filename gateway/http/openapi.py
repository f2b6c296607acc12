"""``GET /openapi.json``: an OpenAPI 3.1 document built from the route table and its pydantic models.

The document lists the routes the gateway answers now (a task-gated route
only while some served model serves it, a route the config turns off not at
all; see ``dialects.route``), each with the JSON schema of the model its body
is validated with (a ``multipart/form-data`` body for a route with a
``form``), its query parameters for a route with a ``query`` model, its
response model when it has one, its dialect's error body, and whether it
needs the API key (the ``bearer`` security scheme on every route that is not
public).
"""

from __future__ import annotations

import re

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from poolgate.gateway.dialects.route import Route, is_live
from poolgate.gateway.http.state import CONFIG, ROUTER
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.version import VERSION
from poolgate.shared.wire.messages import ModelInfo

ROUTES_KEY = web.AppKey("routes", list)  # every mounted Route, in order
REF = "#/components/schemas/{model}"
BEARER = "bearer"  # the API key, as ``Authorization: Bearer KEY``
ERROR_SCHEMAS = {
    "openai": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "cohere": {"type": "object", "required": ["message"], "properties": {"message": {"type": "string"}}},
    "tei": {
        "type": "object",
        "required": ["error", "error_type"],
        "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}},
    },
    "oip": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
}


def document(routes: list[Route], models: list[ModelInfo], config: GatewayConfig | None = None) -> dict:
    """The OpenAPI document of the ``routes`` live for ``models`` and on under ``config`` (default: the
    defaults'); a path two dialects share documents the bodies of each (``oneOf``), as the route tells them
    apart by shape."""
    config = config or GatewayConfig()
    live = {
        route: [p for p in route.alternatives or (route,) if is_live(p, models)]
        for route in routes
        if is_live(route, models) and route.off_because(config) is None
    }
    schemas = _schemas([p for parts in live.values() for p in parts])
    paths: dict[str, dict] = {}
    for route, parts in live.items():
        paths.setdefault(template(route.path), {})[route.method.lower()] = _operation(route, parts, schemas)
    components = dict(schemas.pop("$defs", {}))
    components.update({f"{name.capitalize()}Error": schema for name, schema in ERROR_SCHEMAS.items()})
    return {
        "openapi": "3.1.0",
        "info": {"title": "poolgate", "version": VERSION},
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": {BEARER: {"type": "http", "scheme": "bearer"}}},
    }


def template(path: str) -> str:
    """An aiohttp path as an OpenAPI path template: ``{name:.+}`` (a parameter with its pattern) is ``{name}``."""
    return re.sub(r"{(\w+):[^}]*}", r"{\1}", path)


def _schemas(routes: list[Route]) -> dict:
    """``{(model, mode): schema ref}`` plus ``$defs``: each pydantic model once."""
    pairs: set[tuple[type[BaseModel], JsonSchemaMode]] = {
        (model, "validation") for r in routes for model in (r.request_model, r.form, r.framed) if model is not None
    }
    pairs |= {(r.response_model, "serialization") for r in routes if r.response_model is not None}
    if not pairs:
        return {}
    refs, defs = models_json_schema(sorted(pairs, key=lambda p: (p[0].__name__, p[1])), ref_template=REF)
    return {**refs, "$defs": defs.get("$defs", {})}


def _one_of(schemas: list[dict]) -> dict:
    unique = [s for i, s in enumerate(schemas) if s not in schemas[:i]]
    return unique[0] if len(unique) == 1 else {"oneOf": unique}


def _operation(route: Route, parts: list[Route], schemas: dict) -> dict:
    op: dict = {
        "operationId": f"{route.method.lower()}_{template(route.path).strip('/').replace('/', '_') or 'root'}",
        "summary": route.summary or route.path,
    }
    names = re.findall(r"{(\w+)}", template(route.path))
    parameters = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names]
    if route.query is not None:
        parameters += _query_parameters(route.query)
    if parameters:
        op["parameters"] = parameters
    requests = [schemas[(p.request_model, "validation")] for p in parts if p.request_model is not None]
    if requests:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _one_of(requests)}}}
    if route.framed is not None:  # its JSON part; the binary tensor data that may follow has no schema
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schemas[(route.framed, "validation")]}},
        }
    if route.form is not None:
        form = schemas[(route.form, "validation")]
        op["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": form}}}
    ok: dict = {"description": "OK"}
    answers = [schemas[(p.response_model, "serialization")] for p in parts if p.response_model is not None]
    if answers:
        ok["content"] = {"application/json": {"schema": _one_of(answers)}}
    shapes = _one_of([{"$ref": REF.format(model=f"{p.errors.capitalize()}Error")} for p in parts])
    error = {"description": "Error", "content": {"application/json": {"schema": shapes}}}
    op["responses"] = {"200": ok, "4XX": error, "5XX": error}
    op["security"] = [] if route.public else [{BEARER: []}]
    return op


def _query_parameters(model: type[BaseModel]) -> list[dict]:
    """One ``in: query`` parameter per field of ``model`` (flat fields: a query string has no nesting)."""
    schema = model.model_json_schema()
    required = set(schema.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": field}
        for name, field in schema["properties"].items()
    ]


async def openapi_json(request: web.Request, _body: BaseModel | None = None) -> web.Response:
    app = request.app
    return web.json_response(document(app[ROUTES_KEY], app[ROUTER].models(), app[CONFIG]))


ROUTES = (Route("GET", "/openapi.json", openapi_json, summary="This document", public=True),)
