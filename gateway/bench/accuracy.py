"""The sentence-transformers side of ``poolgate bench``: the baseline run and the cosine checks against float32.

Both import torch only inside the calls (``workers.tools.st_reference``). The
float32 reference vectors are encoded once per run (``Fp32``) and shared by
``--check-cosine`` and ``--compare-peers``; when the baseline itself ran in
float32 its vectors are that reference.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from poolgate.gateway.bench.load import LoadConfig, LoadResult, make_payloads
from poolgate.shared.config.models import bundled_model_path

ACCURATE = 0.999  # the worst cosine to sentence-transformers float32 a run must keep to count as accurate


def model_path(args: argparse.Namespace) -> str:
    """The folder the in-process runs load: ``--st-model``, else the bundled MiniLM."""
    return str(args.st_model or bundled_model_path())


def reference(args: argparse.Namespace, texts: list[str], vectors_out: list | None = None) -> dict:
    """The sentence-transformers run; torch is imported only on this path."""
    from poolgate.workers.tools.st_reference import run_reference

    return run_reference(
        texts,
        model_path=model_path(args),
        passes=args.passes,
        batch_size=args.st_batch_size,
        device=args.st_device,
        dtype=args.st_dtype,
        vectors_out=vectors_out,
    )


class Fp32:
    """sentence-transformers' float32 vectors of ``texts``, encoded at the first ``vectors()`` (or taken from a
    float32 baseline run, ``baseline``)."""

    def __init__(self, args: argparse.Namespace, texts: list[str]) -> None:
        self.args, self.texts = args, texts
        self._vectors: np.ndarray | None = None

    def baseline(self, st_vectors: list[np.ndarray]) -> None:
        if st_vectors and self.args.st_dtype == "float32":
            self._vectors = st_vectors[0]

    def vectors(self) -> np.ndarray:
        if self._vectors is None:
            from poolgate.workers.tools.st_reference import run_reference

            out: list = []
            run_reference(
                self.texts,
                model_path=model_path(self.args),
                batch_size=self.args.st_batch_size,
                device=self.args.st_device,
                dtype="float32",
                vectors_out=out,
            )
            self._vectors = out[0]
        return self._vectors


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (n, dim) arrays."""
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return (a * b).sum(axis=1)


def check_cosine(
    args: argparse.Namespace, cfg: LoadConfig, texts: list[str], result: LoadResult, st_vectors: list, fp32: Fp32
) -> dict[str, Any]:
    """poolgate's vectors (and the baseline's) against sentence-transformers in float32 on the same texts."""
    bodies = [body for body, _ in make_payloads(texts, cfg)]
    missing = sum(body not in result.vectors for body in bodies)
    if missing:
        return {"error": f"{missing} requests gave no vectors"}
    ours = np.concatenate([result.vectors[body] for body in bodies])
    ref = fp32.vectors()
    if ours.shape != ref.shape:
        return {
            "error": f"the served model's vectors {ours.shape} are not the reference's {ref.shape} "
            "(--st-model names the served model's folder)"
        }
    cos = cosines(ours, ref)
    out = {
        "reference": "sentence-transformers float32",
        "vectors": int(cos.shape[0]),
        "poolgate_worst": float(cos.min()),
        "poolgate_mean": float(cos.mean()),
        "poolgate_below_0.999": int((cos < ACCURATE).sum()),
    }
    if st_vectors:
        st = cosines(st_vectors[0], ref)
        out.update(
            st_dtype=args.st_dtype,
            st_worst=float(st.min()),
            st_mean=float(st.mean()),
            **{"st_below_0.999": int((st < ACCURATE).sum())},
        )
    return out
