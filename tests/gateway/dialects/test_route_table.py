"""The route table: routes gated per request by the served models' tasks, error shape per route, /openapi.json."""
from __future__ import annotations

import re

from openapi_spec_validator import validate

from poolgate.gateway.dialects import DIALECTS, all_routes
from poolgate.gateway.dialects.oip import MODEL as OIP_MODEL
from poolgate.gateway.dialects.route import Route, is_live
from poolgate.gateway.http.openapi import document, template
from poolgate.gateway.http.ops import ROUTES as OPS_ROUTES
from poolgate.gateway.http.state import ROUTER
from tests.fakes import fake_model


def classifier(**kw):
    return fake_model(tasks=("classify", "token_classify"), **kw)


async def test_generation_routes_are_404_on_every_model(gateway):
    client = await gateway(models=[fake_model(), classifier(name="clf")])
    for path in ("/v1/chat/completions", "/v1/completions"):
        resp = await client.post(path, json={"model": "fake-model", "messages": [], "prompt": "x"})
        assert resp.status == 404
        assert (await resp.json())["error"]["type"] == "NotFoundError"


async def test_a_route_follows_the_models_served_now(gateway):
    client = await gateway()
    assert (await client.post("/classify", json={"input": "a"})).status == 404
    router = client.app[ROUTER]
    # a model joins at run time (the admin API does this): its routes open without rebuilding the app
    async with _extra_pool(classifier(name="clf")) as pool:
        router.add(pool)
        try:
            resp = await client.post("/classify", json={"input": "a", "model": "clf"})
            assert resp.status == 200
            resp = await client.post("/classify", json={"input": "a", "model": "fake-model"})
            assert resp.status == 400
        finally:
            del router.pools[pool.name]
    assert (await client.post("/classify", json={"input": "a"})).status == 404


async def test_naming_a_model_without_the_routes_task_is_vllms_400(gateway):
    client = await gateway(models=[fake_model(), classifier(name="clf")])
    resp = await client.post("/v1/embeddings", json={"input": "a", "model": "clf"})
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["message"] == "Unsupported task: 'embed' Supported tasks: ('classify', 'token_classify')"
    assert err["param"] == "model"


async def test_an_unknown_model_is_404_before_the_task_gate(gateway):
    client = await gateway()
    resp = await client.post("/v1/embeddings", json={"input": "a", "model": "nope"})
    assert resp.status == 404 and (await resp.json())["error"]["message"] == "The model `nope` does not exist."


def test_every_route_is_data_with_a_known_error_shape():
    from poolgate.gateway.http.errors import ERROR_FORMATS
    routes = [*all_routes(), *OPS_ROUTES]
    assert all(isinstance(r, Route) and r.errors in ERROR_FORMATS for r in routes)
    assert len({(r.method, r.path) for r in routes}) == len(routes)
    assert set(DIALECTS) >= {"openai", "vllm_classify", "vllm_pooling"}


def test_is_live_reads_tasks_or_the_predicate():
    emb, clf = fake_model().info, classifier().info
    route = Route("POST", "/x", None, tasks=("classify",))
    assert not is_live(route, [emb]) and is_live(route, [emb, clf]) and not is_live(route, [])
    always = Route("GET", "/y", None)
    assert is_live(always, [])
    odd = Route("POST", "/z", None, serves=lambda info: info.embedding_dim == 8)
    assert is_live(odd, [emb]) and not odd.served_by(classifier(dim=4).info)


async def test_openapi_lists_the_live_routes_with_their_request_schemas(gateway):
    client = await gateway()
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    doc = await resp.json()
    assert doc["openapi"].startswith("3.")
    assert "/v1/embeddings" in doc["paths"] and "/pooling" in doc["paths"] and "/health" in doc["paths"]
    assert "/classify" not in doc["paths"]  # no classifier served
    op = doc["paths"]["/v1/embeddings"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert "input" in schema["properties"] and "encoding_format" in schema["properties"]
    assert op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith("OpenaiError")
    _all_refs_resolve(doc)


def test_openapi_document_is_built_from_the_table_alone_and_is_valid_openapi():
    doc = document([*all_routes(), *OPS_ROUTES], [fake_model().info, classifier().info])
    assert {"/classify", "/v1/classify", "/v1/embeddings", "/pooling", "/v1/models"} <= set(doc["paths"])
    _all_refs_resolve(doc)
    validate(doc)  # the OpenAPI 3.1 schema, defaults included
    for path in ("/v1/embeddings", "/classify", "/pooling", "/v2/embed"):
        ok = doc["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok["$ref"].rsplit("/", 1)[1] in doc["components"]["schemas"]


def test_openapi_documents_every_route_and_its_error_shape():
    everything = [fake_model(tasks=("embed", "token_embed")).info, classifier(num_labels=1).info]
    routes = [*all_routes(), *OPS_ROUTES]
    doc = document(routes, everything)
    validate(doc)
    for route in routes:
        if not is_live(route, everything):
            continue
        op = doc["paths"][template(route.path)][route.method.lower()]
        parts = route.alternatives or (route,)  # a shared path documents each dialect's body (oneOf)
        assert ("requestBody" in op) == any(p.request_model or p.framed for p in parts), route.path
        assert ("content" in op["responses"]["200"]) == any(p.response_model is not None for p in parts), route.path
        error = op["responses"]["4XX"]["content"]["application/json"]["schema"]
        refs = [e["$ref"] for e in error.get("oneOf", [error])]
        assert sorted(refs) == sorted({f"#/components/schemas/{p.errors.capitalize()}Error" for p in parts}), route.path


def test_openapi_declares_the_path_parameters_of_templated_routes():
    from poolgate.gateway.admin import ROUTES as ADMIN_ROUTES
    from poolgate.gateway.http.docs import ROUTES as DOCS_ROUTES

    routes = [*all_routes(), *OPS_ROUTES, *ADMIN_ROUTES, *DOCS_ROUTES]
    doc = document(routes, [fake_model().info])
    validate(doc)
    templated = [r for r in routes if "{" in r.path]
    assert {r.path for r in templated} >= {"/admin/models/{name}", "/docs/{name}", OIP_MODEL + "/infer"}
    for route in templated:  # a client (a fuzzer, a generated SDK) can fill the template
        op = doc["paths"][template(route.path)][route.method.lower()]  # {name:.+} (a pattern) is {name}
        declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path" and p["required"]}
        assert declared == set(re.findall(r"{(\w+)", route.path)), route.path


def _all_refs_resolve(doc: dict) -> None:
    schemas = doc["components"]["schemas"]

    def walk(node):
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(doc)


def _extra_pool(model):
    import contextlib

    from tests.gateway.conftest import served_router

    @contextlib.asynccontextmanager
    async def pool():
        async with served_router([model]) as router:
            yield next(iter(router.pools.values()))
    return pool()


async def test_answers_match_their_documented_response_models(gateway):
    client = await gateway(models=[fake_model(tasks=("embed", "token_embed", "classify"))])
    bodies = {"/v1/embeddings": [{"input": ["a b"]}, {"input": "a", "encoding_format": "base64"}],
              "/classify": [{"input": ["a b", "c"]}], "/pooling": [{"input": "a", "task": "token_embed"}],
              "/v2/embed": [{"texts": ["a"], "embedding_types": ["float", "int8", "binary", "base64"]}],
              "/v1/embed": [{"texts": ["a"]}]}
    routes = {(r.method, r.path): r for r in all_routes()}
    for path, cases in bodies.items():
        for body in cases:
            resp = await client.post(path, json=body)
            assert resp.status == 200, await resp.text()
            model, out = routes[("POST", path)].response_model, await resp.json()
            model.model_validate(out)
            assert set(out) == set(model.model_fields), path  # every key documented, none missing
