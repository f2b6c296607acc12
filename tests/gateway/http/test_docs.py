"""GET /docs: Swagger UI from the swagger-ui-bundle wheel, public like /openapi.json; and in a real headless
Chromium (Debian's chromium and chromium-driver, PyPI's selenium): the page lists every route of the document,
and "Try it out" on POST /v1/embeddings answers 200 with a vector."""
from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from poolgate.gateway.app import make_app
from poolgate.shared.config.frozen import GatewayConfig
from tests.fakes import fake_model
from tests.gateway.conftest import served_router

KEYED = GatewayConfig(api_key="sekrit")
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


async def test_the_page_and_its_assets_are_public(gateway):
    client = await gateway(config=KEYED)
    resp = await client.get("/docs")
    assert resp.status == 200 and resp.content_type == "text/html"
    page = await resp.text()
    assert 'url: "openapi.json"' in page and "docs/swagger-ui-bundle.js" in page
    js = await client.get("/docs/swagger-ui-bundle.js")
    assert js.status == 200 and js.content_type == "application/javascript" and b"SwaggerUIBundle" in await js.read()
    assert (await client.get("/docs/swagger-ui.css")).status == 200
    for name in ("index.html", "..%2F..%2Fsetup.py", "swagger-ui.js.map"):
        assert (await client.get(f"/docs/{name}")).status == 404
    assert (await client.post("/v1/embeddings", json={"input": "x"})).status == 401  # what the page calls is not


async def test_the_document_says_which_routes_need_the_key(gateway):
    client = await gateway()
    doc = await (await client.get("/openapi.json")).json()
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert doc["paths"]["/v1/embeddings"]["post"]["security"] == [{"bearer": []}]
    assert doc["paths"]["/health"]["get"]["security"] == [] and doc["paths"]["/docs"]["get"]["security"] == []


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def _browse(url: str, shots: Path) -> dict:
    """Open /docs in headless Chromium, list its operations, run "Try it out" on POST /v1/embeddings."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,2400"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        wait = WebDriverWait(driver, 30)
        driver.get(f"{url}/docs")
        wait.until(ready.presence_of_all_elements_located((By.CSS_SELECTOR, ".opblock")))
        listed = {(b.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
                   b.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"))
                  for b in driver.find_elements(By.CSS_SELECTOR, ".opblock")}
        driver.save_screenshot(str(shots / "docs.png"))
        block = driver.find_element(By.ID, "operations-default-post_v1_embeddings")
        block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
        wait.until(lambda d: block.find_elements(By.CSS_SELECTOR, ".try-out__btn"))[0].click()
        body = wait.until(lambda d: block.find_elements(By.CSS_SELECTOR, "textarea.body-param__text"))[0]
        body.clear()
        body.send_keys(json.dumps({"input": "hello from the browser"}))
        block.find_element(By.CSS_SELECTOR, ".execute").click()
        status = wait.until(lambda d: block.find_elements(By.CSS_SELECTOR, ".live-responses-table tbody .response-col_status"))
        answer = block.find_element(By.CSS_SELECTOR, ".live-responses-table .microlight, "
                                                     ".live-responses-table pre").text
        driver.save_screenshot(str(shots / "try-it-out.png"))
        return {"listed": listed, "status": status[0].text.split()[0], "answer": answer}
    finally:
        driver.quit()


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")
async def test_swagger_ui_in_headless_chromium(live_server, tmp_path):
    async with served_router([fake_model()]) as router:
        url = await live_server(make_app(GatewayConfig(), router))
        doc = json.loads(await asyncio.to_thread(_get, f"{url}/openapi.json"))
        seen = await asyncio.to_thread(_browse, url, tmp_path)
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    print(f"Chromium listed {len(seen['listed'])} operations: {sorted(seen['listed'])}; screenshots in {tmp_path}")
    assert seen["listed"] == documented
    assert seen["status"] == "200", seen
    answer = json.loads(seen["answer"])
    assert len(answer["data"][0]["embedding"]) == 8 and answer["object"] == "list"
