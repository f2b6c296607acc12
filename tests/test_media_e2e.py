"""`poolgate serve` of a tiny random CLIP with the media flags, as a real process: image URLs fetched from a real
HTTP server on 127.0.0.1 equal the same image sent inline, and every bad input is a 400 naming why.

The flags reach the gateway's fetcher and the model's decoder through the one path (``ModelSettings`` ->
``PoolConfig.media`` -> the fleet's ``Front``): ``--allowed-media-domains 127.0.0.1`` (so ``localhost``, a name
for the same address, is refused), ``--max-images-per-request 2``, ``--max-image-pixels 100000``,
``--max-media-bytes 1000000``.
"""
from __future__ import annotations

import base64
import io
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import requests
from PIL import Image

from poolgate.shared.telemetry import names
from tests.processes import alive, children, free_port, wait_healthy
from tests.workers.media.dual_encoders import make_dual, png

PICTURE = png(11, 40, 30)
LIMITS = ["--max-images-per-request", "2", "--max-image-pixels", "100000", "--max-media-bytes", "1000000"]


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


class Pictures(BaseHTTPRequestHandler):
    """The test's image server: /img.png, /big (2 MB), /redirect (to localhost), anything else 404."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/img.png":
            self._send(200, PICTURE)
        elif self.path == "/big":
            self._send(200, bytes(2_000_000))
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_port}/img.png")
            self.end_headers()
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def pictures():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def clip_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip")
    make_dual(folder, "clip")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", str(folder), "--port", str(port),
                             "--served-model-name", "tiny-clip", "--dtype", "float32",
                             "--allowed-media-domains", "127.0.0.1", *LIMITS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 180, proc)
        yield url
    finally:
        workers = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert workers and not [p for p in workers if alive(p)]


def embed(url: str, *parts: dict) -> requests.Response:
    body = {"model": "tiny-clip", "messages": [{"role": "user", "content": list(parts)}]}
    return requests.post(f"{url}/v1/embeddings", json=body, timeout=60)


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def inline(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_a_fetched_image_is_the_same_image_sent_inline(clip_server, pictures):
    fetched = embed(clip_server, image_part(f"{pictures}/img.png"))
    sent = embed(clip_server, image_part(inline(PICTURE)))
    assert fetched.status_code == 200 and sent.status_code == 200, fetched.text
    a, b = (np.array(r.json()["data"][0]["embedding"]) for r in (fetched, sent))
    assert a.shape == (24,) and np.array_equal(a, b)
    other = np.array(embed(clip_server, image_part(inline(png(12, 40, 30)))).json()["data"][0]["embedding"])
    assert not np.allclose(a, other)  # (a different picture is a different vector)


def bad_inputs(pictures: str) -> list[tuple[str, list[dict], str]]:
    """(what, content parts, what the 400's message says)."""
    photo = Image.fromarray(np.random.default_rng(3).integers(0, 256, (30, 40, 3), dtype=np.uint8))
    jpeg = encoded(photo, "JPEG")
    host = pictures.removeprefix("http://")
    return [
        ("URL host not listed", [image_part(pictures.replace("127.0.0.1", "localhost") + "/img.png")],
         "image URL host localhost is not in --allowed-media-domains"),
        ("redirect to a host not listed", [image_part(f"{pictures}/redirect")],
         "image URL host localhost is not in --allowed-media-domains"),
        ("URL answering 404", [image_part(f"{pictures}/secret/missing.png?key=abc")],
         "image URL host 127.0.0.1 answered HTTP 404, not 200"),
        ("URL body over --max-media-bytes", [image_part(f"{pictures}/big")],
         "image URL host 127.0.0.1 sent more than this server's --max-media-bytes 1,000,000"),
        ("URL with credentials", [image_part(f"http://bob:pw@{host}/img.png")],
         "URLs with a user name or password are not fetched"),
        ("file: URL", [image_part("file:///etc/passwd")], "a media URL must be a data: or http(s): URL"),
        ("3 images, --max-images-per-request 2", [image_part(inline(PICTURE))] * 3,
         "the request holds 3 images and audio clips, over this server's --max-images-per-request 2"),
        ("corrupt PNG", [image_part(inline(PICTURE[:50] + bytes(100) + PICTURE[150:]))], "truncated or corrupt"),
        ("truncated JPEG", [image_part(inline(jpeg[: len(jpeg) // 2], "image/jpeg"))], "truncated or corrupt"),
        ("PDF", [image_part(inline(b"%PDF-1.7\n%\xe2\xe3\n1 0 obj\n", "application/pdf"))],
         "image format PDF is not supported"),
        ("SVG", [image_part(inline(b'<svg xmlns="http://www.w3.org/2000/svg"/>', "image/svg+xml"))],
         "image format SVG is not supported"),
        ("30,000 x 30,000 PNG", [image_part(inline(encoded(Image.new("1", (30000, 30000)), "PNG",
                                                           compress_level=1)))],
         "the image has 900,000,000 pixels (a decompression bomb), over this server's --max-image-pixels 100,000"),
        ("400 x 400 PNG, --max-image-pixels 100000", [image_part(inline(encoded(Image.new("RGB", (400, 400)),
                                                                                 "PNG")))],
         "the image is 400 x 400 = 160,000 pixels, over this server's --max-image-pixels 100,000"),
        ("not base64", [image_part("data:image/png;base64,@@@")], "not valid base64"),
    ]


def test_bad_inputs_are_400s_naming_why(clip_server, pictures):
    rows = []
    for what, parts, message in bad_inputs(pictures):
        answer = embed(clip_server, *parts)
        got = answer.json()["error"]["message"] if answer.status_code != 200 else answer.text[:80]
        rows.append(f"| {what} | {answer.status_code} | {got} |")
        assert answer.status_code == 400, (what, got)
        assert message in got, (what, got)
        assert "pw@" not in got and "secret" not in got and "key=abc" not in got
    print("\n".join(rows))  # the bad-input table (pytest -s)
    assert embed(clip_server, image_part(f"{pictures}/img.png")).status_code == 200  # still serving


def test_media_items_are_counted_by_kind(clip_server, pictures):
    assert embed(clip_server, image_part(inline(PICTURE))).status_code == 200
    text = requests.get(f"{clip_server}/metrics", timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith(f"{names.MEDIA_ITEMS}_total{{"))
    assert 'kind="image"' in line and 'model="tiny-clip"' in line and float(line.split()[-1]) >= 1
