"""``GET /docs``: Swagger UI over ``/openapi.json``, served from the ``swagger-ui-bundle`` wheel (no CDN).

As vLLM, TEI and Infinity do, the gateway serves an interactive page of its
API: the route list, each body's schema and "Try it out". The page and its
assets are public, like ``/openapi.json``, and not recorded; the requests the
page sends are ordinary API requests (guarded by the API key: the document's
``bearer`` scheme fills the page's "Authorize" dialog). Paths are relative,
so the page works behind a proxy that mounts the gateway under a prefix.
Only the files the page loads are served (``ASSETS``).
"""

from __future__ import annotations

from aiohttp import web
from swagger_ui_bundle import swagger_ui_path

from poolgate.gateway.dialects.route import Route

ASSETS = {
    "swagger-ui.css": "text/css",
    "swagger-ui-bundle.js": "application/javascript",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
}
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>poolgate API</title>
  <link rel="stylesheet" href="docs/swagger-ui.css">
  <link rel="icon" type="image/png" href="docs/favicon-32x32.png" sizes="32x32">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="docs/swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({url: "openapi.json", dom_id: "#swagger-ui", deepLinking: true,
                                 presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout"});
  </script>
</body>
</html>
"""


async def page(request: web.Request, _body: None = None) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def asset(request: web.Request, _body: None = None) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.FileResponse(
        swagger_ui_path / name, headers={"Content-Type": ASSETS[name], "Cache-Control": "public, max-age=86400"}
    )


ROUTES = (
    Route("GET", "/docs", page, summary="Swagger UI over /openapi.json", public=True, recorded=False),
    Route("GET", "/docs/{name}", asset, summary="Swagger UI's assets", public=True, recorded=False),
)
