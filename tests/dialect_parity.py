"""The same texts through every dialect and encoding of a running gateway, decoded, against the OpenAI float vectors.

``python -m tests.dialect_parity`` starts ``poolgate serve`` on the bundled
MiniLM (float32), sends ~20 varied texts through each dialect/encoding, and
prints the worst cosine of each against ``/v1/embeddings`` float (and the
largest absolute difference); ``--url`` uses a gateway that is already up.
The live SDK tests (tests/test_dialects_e2e.py) use ``collect`` too.
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.request

import numpy as np

TEXTS = [
    "a", "!", "Hello, world.", "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors; similar meanings land close together.",
    "¿Dónde está la biblioteca?", "東京は日本の首都です。", "Привет, как дела?", "emoji 🚀🔥 test",
    "SELECT * FROM users WHERE id = 42;", "def f(x):\n    return x ** 2", "1234567890 3.14159 2.71828",
    "   leading and trailing spaces   ", "UPPER CASE SHOUTING TEXT", "a " * 200,
    "The mitochondria is the powerhouse of the cell.", "Retrieval-augmented generation needs good embeddings.",
    "tab\tseparated\tvalues", "https://example.com/path?query=1&other=2", "The end.",
]
EMBED_DTYPES = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
NP_VIEW = {"float32": "<f4", "float16": "<f2", "bfloat16": "<i2", "fp8_e4m3": "u1", "fp8_e5m2": "u1"}


def post(url: str, path: str, body: dict) -> tuple[bytes, dict]:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.read(), dict(resp.headers)


def decode(raw: bytes, embed_dtype: str, shape) -> np.ndarray:
    """Raw little-endian codes of ``embed_dtype`` to float32 (torch's dtype views, as vLLM's client does)."""
    import torch

    arr = np.frombuffer(raw, dtype=NP_VIEW[embed_dtype]).copy()
    if embed_dtype == "float32":
        return arr.astype(np.float32).reshape(shape)
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                   "fp8_e5m2": torch.float8_e5m2}[embed_dtype]
    return torch.from_numpy(arr).view(torch_dtype).float().numpy().reshape(shape)


def dequantize(kind: str, value) -> np.ndarray:
    """A float vector back from a Cohere quantized type, as a client decodes it (q / 127, q / 127.5 - 1; unpacked
    bits as +-1), by the scheme ``gateway/dialects/quantize.py`` documents."""
    q = np.asarray(value)
    if kind == "int8":
        return q.astype(np.float32) / 127.0
    if kind == "uint8":
        return q.astype(np.float32) / 127.5 - 1.0
    if kind in ("binary", "ubinary"):
        bits = np.unpackbits((q.astype(np.int16) + (128 if kind == "binary" else 0)).astype(np.uint8), axis=-1)
        return bits.astype(np.float32) * 2 - 1
    raise ValueError(kind)


def collect(url: str, texts: list[str] = TEXTS) -> dict[str, np.ndarray]:
    """``{dialect/encoding: (n, dim) float32}`` for ``texts``, each decoded as a client would."""
    out: dict[str, np.ndarray] = {}
    body = {"input": texts, "endianness": "little"}
    raw, _ = post(url, "/v1/embeddings", {**body, "encoding_format": "float"})
    out["openai float"] = np.float32([d["embedding"] for d in json.loads(raw)["data"]])
    dim = out["openai float"].shape[1]
    for dtype in EMBED_DTYPES:
        raw, _ = post(url, "/v1/embeddings", {**body, "encoding_format": "base64", "embed_dtype": dtype})
        out[f"openai base64 {dtype}"] = np.stack([decode(base64.b64decode(d["embedding"]), dtype, (dim,))
                                                  for d in json.loads(raw)["data"]])
        raw, headers = post(url, "/v1/embeddings", {**body, "encoding_format": "bytes", "embed_dtype": dtype})
        items = json.loads(headers["metadata"])["data"]
        out[f"openai bytes {dtype}"] = np.stack([decode(raw[i["start"]:i["end"]], dtype, i["shape"]) for i in items])
    types = ["float", "base64", "int8", "uint8", "binary", "ubinary"]
    raw, _ = post(url, "/v2/embed", {"texts": texts, "embedding_types": types})
    emb = json.loads(raw)["embeddings"]
    out["cohere float"] = np.float32(emb["float"])
    out["cohere base64"] = np.stack([np.frombuffer(base64.b64decode(b), "<f4") for b in emb["base64"]])
    for kind in ("int8", "uint8", "binary", "ubinary"):
        out[f"cohere {kind}"] = np.stack([dequantize(kind, v) for v in emb[kind]])
    raw, _ = post(url, "/pooling", {"input": texts})
    out["vllm /pooling float"] = np.float32([d["data"] for d in json.loads(raw)["data"]])
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as resp:
        infer = f"/v2/models/{json.load(resp)['data'][0]['id']}/infer"
    request = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    raw, _ = post(url, infer, request)
    out["oip json"] = np.float32(json.loads(raw)["outputs"][0]["data"]).reshape(-1, dim)
    raw, headers = post(url, infer, {**request, "parameters": {"binary_data_output": True}})
    out["oip binary"] = np.frombuffer(raw[int(headers["Inference-Header-Content-Length"]):], "<f4").reshape(-1, dim)
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def table(vectors: dict[str, np.ndarray]) -> list[tuple[str, float, float]]:
    """(name, worst cosine, max abs difference) of each entry against ``openai float``."""
    ref = vectors["openai float"]
    return [(name, float(cosines(v, ref).min()), float(np.abs(v - ref).max())) for name, v in vectors.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running gateway (default: start poolgate serve on the bundled model)")
    args = parser.parse_args(argv)
    if args.url:
        return _print(args.url)
    import signal
    import subprocess

    from tests.processes import free_port, wait_healthy
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--port", str(port),
                             "--dtype", "float32"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 180, proc)
        return _print(f"http://127.0.0.1:{port}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _print(url: str) -> int:
    rows = table(collect(url))
    print(f"{len(TEXTS)} texts, worst cosine against /v1/embeddings float "
          "(binary/ubinary decoded as ±1 signs: their abs diff means nothing)\n")
    print(f"| {'dialect / encoding':<28} | worst cosine | max abs diff |\n|---|---|---|")
    for name, cos, diff in rows:
        print(f"| {name:<28} | {cos:.7f} | {diff:.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
