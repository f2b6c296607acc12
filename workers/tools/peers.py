"""The CPU peers ``poolgate bench --compare-peers`` times beside poolgate, each in this process on the same texts.

- ``onnxruntime``: the folder's ONNX export (``peer_export``) in an ONNX Runtime
  CPU session, float32, ``intra_op_num_threads`` = the threads given, one
  inter-op thread, every graph optimization.
- ``openvino`` / ``openvino-bf16``: the same ONNX file read by OpenVINO and
  ``compile_model(model, "CPU", {INFERENCE_PRECISION_HINT: f32 | bf16,
  INFERENCE_NUM_THREADS: threads, PERFORMANCE_HINT: LATENCY})``; the dtype
  reported is the precision the compiled model says it runs (bf16 falls back to
  f32 on a CPU without bf16 instructions). Under ``ONEDNN_MAX_CPU_ISA`` (set by
  ``POOLGATE_CPU_CLASS``) ``OV_CPU_MAX_ISA`` is set to the same, so OpenVINO's
  oneDNN kernels take the smaller class's paths (``isa_cap`` in the report).
- ``st-onnx`` / ``st-openvino``: sentence-transformers' own ``backend="onnx"`` /
  ``"openvino"``, which need optimum's ONNX Runtime or Intel packages.

The three first peers encode as sentence-transformers does: the same tokenizer
and ``max_seq_length`` truncation, texts sorted longest first, batches of
``batch_size`` padded to their longest, then the folder's pooling in numpy.
After a warm-up of 64 texts only the encode passes are timed (tokenizing
included, as in the baseline). Tokens are counted as the baseline counts them.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from poolgate.workers.tools.peer_export import Folder, load_folder, pool
from poolgate.workers.tools.st_reference import count_tokens

PEERS = ("onnxruntime", "openvino", "openvino-bf16", "st-onnx", "st-openvino")
_NEEDS = {  # peer -> (module it imports, the distribution that brings it)
    "onnxruntime": ("onnxruntime", "onnxruntime"),
    "openvino": ("openvino", "openvino"),
    "openvino-bf16": ("openvino", "openvino"),
    "st-onnx": ("optimum.onnxruntime", "optimum-onnx[onnxruntime]"),
    "st-openvino": ("optimum.intel", "optimum-intel[openvino]"),
}
WARMUP_TEXTS = 64
Run = Callable[[dict[str, np.ndarray]], np.ndarray]  # tokenizer outputs -> last hidden state


def missing(peer: str) -> str | None:
    """Why ``peer`` cannot run in this install (None: it can)."""
    module, dist = _NEEDS[peer]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    return None if found else f"needs {dist} (pip install {dist}), not installed"


def _onnxruntime(folder: Folder, threads: int) -> tuple[Run, str, str]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(folder.onnx_path), opts, providers=["CPUExecutionProvider"])
    return (lambda feed: session.run(None, feed)[0]), "float32", f"onnxruntime {ort.__version__}"


def isa_cap(peer: str) -> str | None:
    """The most instructions ``peer`` may use here: OpenVINO's ``OV_CPU_MAX_ISA``; None (no cap) for ONNX
    Runtime, whose MLAS picks its kernels from CPUID with no run-time switch."""
    return os.environ.get("OV_CPU_MAX_ISA") if "openvino" in peer else None


def _openvino(folder: Folder, threads: int, precision: str) -> tuple[Run, str, str]:
    # OpenVINO's CPU plugin caps its own kernels by OV_CPU_MAX_ISA and its oneDNN by ONEDNN_MAX_CPU_ISA (which
    # POOLGATE_CPU_CLASS sets); with the second alone (2026.4) it fails to compile (no Softmax primitive), so the
    # first follows it, set before the plugin loads.
    if "ONEDNN_MAX_CPU_ISA" in os.environ:
        os.environ.setdefault("OV_CPU_MAX_ISA", os.environ["ONEDNN_MAX_CPU_ISA"])
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(core.read_model(str(folder.onnx_path)), "CPU", config)
    request = compiled.create_infer_request()
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")  # what it compiled to: an ov.Type (f32, bf16)
    runs = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
    dtype = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}.get(runs.lower(), runs)

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(request.infer(feed)[0])

    return run, dtype, f"openvino {ov.__version__}"


def encode(run: Run, folder: Folder, texts: list[str], batch_size: int) -> np.ndarray:
    """``texts`` to (n, dim) float32 vectors, longest first in batches of ``batch_size``, in their own order."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    parts: list[np.ndarray] = []
    for start in range(0, len(texts), batch_size):
        batch = [texts[i] for i in order[start : start + batch_size]]
        enc = folder.tokenizer(
            batch, padding=True, truncation=True, max_length=folder.max_seq_length, return_tensors="np"
        )
        feed = {k: np.asarray(enc[k], dtype=np.int64) for k in folder.input_names}
        parts.append(pool(run(feed), feed["attention_mask"], folder.pooling, folder.normalize))
    vectors = np.concatenate(parts)
    out = np.empty_like(vectors)
    out[order] = vectors
    return out


def _timed(encode_all: Callable[[list[str]], np.ndarray], texts: list[str], passes: int) -> tuple[np.ndarray, float]:
    encode_all(texts[:WARMUP_TEXTS])
    start = time.perf_counter()
    for _ in range(passes):
        vectors = encode_all(texts)
    return vectors, time.perf_counter() - start


def _st_backend(path: str, backend: str, threads: int) -> tuple[Callable[[list[str]], np.ndarray], Any]:
    """sentence-transformers with its ONNX or OpenVINO backend (optimum exports the folder itself)."""
    from sentence_transformers import SentenceTransformer

    if backend == "onnx":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        kwargs: dict[str, Any] = {"provider": "CPUExecutionProvider", "session_options": opts}
    else:
        kwargs = {"ov_config": {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}}
    model = SentenceTransformer(path, device="cpu", backend=backend, model_kwargs=kwargs)
    return model.encode, model


def run_peers(
    texts: list[str], *, model_path: str, peers: list[str], threads: int, batch_size: int = 32, passes: int = 1
) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
    """Each of ``peers`` over ``texts`` ``passes`` times: per peer its counts, rates, dtype and threads (or
    ``{"skipped": why}``), and its last pass's vectors."""
    results: dict[str, dict] = {}
    vectors: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory(prefix="poolgate-peers-") as tmp:
        folder: Folder | None = None
        for peer in peers:
            if (why := missing(peer)) is not None:
                results[peer] = {"skipped": why}
                continue
            try:
                if peer.startswith("st-"):
                    encode_all, st = _st_backend(model_path, peer[3:], threads)
                    max_len, tokenizer = int(st.max_seq_length), st.tokenizer
                    dtype, runtime = "float32", f"sentence-transformers backend={peer[3:]}"
                else:
                    folder = folder or load_folder(model_path, Path(tmp))
                    if peer == "onnxruntime":
                        run, dtype, runtime = _onnxruntime(folder, threads)
                    else:
                        run, dtype, runtime = _openvino(folder, threads, "bf16" if peer.endswith("bf16") else "f32")
                    max_len, tokenizer = folder.max_seq_length, folder.tokenizer

                    def encode_all(xs: list[str], run: Run = run, folder: Folder = folder) -> np.ndarray:
                        return encode(run, folder, xs, batch_size)

                got, wall = _timed(lambda xs, f=encode_all: np.asarray(f(xs), dtype=np.float32), texts, passes)
            except (ImportError, ValueError, RuntimeError) as exc:  # an export or a runtime that cannot take it
                results[peer] = {"skipped": f"{type(exc).__name__}: {exc}"[:400]}
                continue
            tokens = count_tokens(tokenizer, texts, max_len) * passes
            vectors[peer] = got
            results[peer] = {
                "runtime": runtime, "dtype": dtype, "threads": threads, "isa_cap": isa_cap(peer),
                "batch_size": batch_size, "max_seq_length": max_len, "passes": passes, "inputs": len(texts) * passes,
                "prompt_tokens": tokens, "embedding_dim": int(got.shape[1]), "wall_s": wall,
                "tokens_per_s": tokens / wall if wall > 0 else 0.0,
                "inputs_per_s": len(texts) * passes / wall if wall > 0 else 0.0,
            }  # fmt: skip
    return results, vectors
