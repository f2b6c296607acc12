"""No API key, token ids or request text in the logs at the default level: a live `poolgate serve --api-key`
(gateway and worker writing one stderr) gets good and bad requests carrying a secret key and a secret text
(a wrong key, a key in the wrong scheme, a NUL byte in the Authorization header, bad JSON, a field out of
range, an input over the character cap, an unknown model), and neither appears in what it logged."""
from __future__ import annotations

import socket
from urllib.parse import urlparse

import requests

from poolgate.shared.config.models import DEFAULT_MODEL_NAME
from tests.live_server import live_server

KEY = "sk-secret-key-4f1c9a77e2"
SECRET = "quixotic zephyr marmalade"  # words no log line has
TEXT = f"the launch code is {SECRET} tonight"
MAX_CHARS = 300


def raw_nul_header(url: str, key: str) -> bytes:
    """A request whose Authorization header holds a NUL byte (aiohttp answers 400 before any handler)."""
    where = urlparse(url)
    with socket.create_connection((where.hostname, where.port), timeout=10) as s:
        s.sendall(f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\0\r\n"
                  "Content-Length: 2\r\n\r\n{}".encode())
        return s.recv(64)


def send_everything(url: str) -> list[int]:
    """Every request below; their statuses, in order."""
    auth, wrong = {"Authorization": f"Bearer {KEY}"}, {"Authorization": f"Bearer {KEY}x"}
    body = {"model": DEFAULT_MODEL_NAME, "input": [TEXT, SECRET]}
    calls = [
        ("post", "/v1/embeddings", {"json": body, "headers": auth}),
        ("post", "/v2/embed", {"json": {"model": DEFAULT_MODEL_NAME, "texts": [TEXT], "input_type": "search_query",
                                        "embedding_types": ["float"]}, "headers": auth}),
        ("post", "/tokenize", {"json": {"model": DEFAULT_MODEL_NAME, "prompt": TEXT}, "headers": auth}),
        ("post", "/v1/embeddings", {"json": body, "headers": wrong}),
        ("post", "/v1/embeddings", {"json": body, "headers": {"Authorization": KEY}}),
        ("post", "/v1/embeddings", {"json": body}),
        ("post", "/v1/embeddings", {"data": f'{{"input": "{TEXT}", '.encode(), "headers": auth}),
        ("post", "/v1/embeddings", {"json": {**body, "dimensions": -3}, "headers": auth}),
        ("post", "/v1/embeddings", {"json": {**body, "input": TEXT * 20}, "headers": auth}),
        ("post", "/v1/embeddings", {"json": {**body, "model": SECRET}, "headers": auth}),
        ("get", f"/v1/models?q={SECRET}", {"headers": wrong}),
    ]
    return [getattr(requests, method)(url + path, timeout=60, **kw).status_code for method, path, kw in calls]


def test_neither_the_key_nor_the_text_is_logged_at_the_default_level(tmp_path):
    with live_server(tmp_path, "--api-key", KEY, "--max-chars-per-input", str(MAX_CHARS)) as server:
        statuses = send_everything(server.url)
        assert raw_nul_header(server.url, KEY).split(b" ")[1] == b"400"
        ids = requests.post(f"{server.url}/tokenize", json={"model": DEFAULT_MODEL_NAME, "prompt": SECRET},
                            headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()["tokens"]
    assert statuses[:3] == [200, 200, 200] and statuses[3:6] == [401, 401, 401]
    assert all(400 <= s < 500 for s in statuses[6:]), statuses
    log = server.log_text()
    assert "worker ready" in log and "ready: serving" in log  # the worker's stderr and the gateway's are here
    assert "malformed HTTP request" in log  # the NUL header was logged, as one line
    for secret in (KEY, SECRET, *SECRET.split(), ", ".join(map(str, ids[1:-1]))):
        assert secret not in log, f"{secret!r} is in the log:\n{log[-3000:]}"
    assert "Traceback" not in log
