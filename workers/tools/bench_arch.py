"""Packed vs transformers-fallback throughput for one model shape, in one process, on the same batches.

``SHAPES`` names real model shapes (family → size → Hugging Face config); a
shape becomes a random-weight checkpoint in a temporary folder (weights do not
change speed), built through ``workers.models`` twice: once as poolgate's
packed family, once as transformers' AutoModel (the fallback every
unregistered architecture gets, padded to each batch's longest). Both run the
same tokenized synthetic corpus (``shared.domain.corpus``, BERT-uncased ids)
in the same token-budget batches through a ``PoolingRunner`` with the same
pooler, after an untimed warm-up on a few texts; batch by batch in turn, so a
busy machine slows both alike. The result also carries the
worst cosine between the two paths' pooled vectors on the first batch, so a
fast but wrong packed path shows.

The shapes are ``workers.tools.bench_shapes.SHAPES``.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from poolgate.workers.tools.bench_shapes import SHAPES

WARM_UP_TEXTS = 8


@dataclass(frozen=True)
class BenchConfig:
    family: str
    shape: str
    dtype: str = "float32"
    num_texts: int = 256
    seed: int = 0
    max_len: int = 512
    batch_tokens: int = 8192
    sort: bool = False  # length-sort the corpus first (the padded path's best case)
    num_threads: int | None = None


@dataclass(frozen=True)
class PathResult:
    implementation: str
    seconds: float
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def shape_config(family: str, shape: str) -> dict:
    """The shape's config values; KeyError naming what exists."""
    if family not in SHAPES or shape not in SHAPES[family]:
        known = ", ".join(f"{f}/{s}" for f, sizes in SHAPES.items() for s in sizes)
        raise KeyError(f"no shape {family}/{shape} (known: {known})")
    return dict(SHAPES[family][shape])


def make_checkpoint(folder: Path, family: str, shape: str, seed: int = 0) -> str:
    """A random-weight safetensors checkpoint of the shape in ``folder``; returns its architecture name."""
    import transformers
    from transformers import AutoConfig

    values = shape_config(family, shape)
    model_type, architecture = values.pop("model_type"), values.pop("architecture")
    config = AutoConfig.for_model(model_type, **values)
    config.architectures = [architecture]
    torch.manual_seed(seed)
    getattr(transformers, architecture)(config).eval().save_pretrained(folder, safe_serialization=True)
    return architecture


def corpus_ids(num_texts: int, seed: int, max_len: int, sort: bool) -> list[list[int]]:
    """The synthetic bench corpus as BERT-uncased token ids (the bundled MiniLM's tokenizer), capped."""
    from poolgate.shared.domain.corpus import synthetic_corpus
    from poolgate.shared.config.models import bundled_model_path
    from poolgate.workers.load.hf_tokenizer import load_encoder

    ids = load_encoder(bundled_model_path()).encode(synthetic_corpus(num_texts, seed), max_tokens=max_len)
    return sorted(ids, key=len) if sort else ids


def batches(ids: list[list[int]], budget: int) -> list[list[list[int]]]:
    """FIFO token-budget batches, as the scheduler forms them under load."""
    out, current, used = [], [], 0
    for s in ids:
        if current and used + len(s) > budget:
            out.append(current)
            current, used = [], 0
        current.append(s)
        used += len(s)
    return out + ([current] if current else [])


def _runner(folder: Path, dtype: torch.dtype, packed: bool, max_len: int):
    from poolgate.shared.config.frozen import WorkerConfig
    from poolgate.workers.backends import get_backend
    from poolgate.workers.models import build_model, open_weights
    from poolgate.workers.models.hf_auto import HfAutoEncoder
    from poolgate.workers.pooling.for_model import poolers_for
    from poolgate.workers.engine.runner import PoolingRunner
    from poolgate.workers.load.st_config import read_spec

    spec = read_spec(WorkerConfig(model=str(folder), served_model_name="bench", max_model_len=max_len))
    backend = get_backend("cpu")
    if packed:
        model, arch = build_model(spec, backend.ops(dtype), allow_pickle=False)
        if not arch.packed:
            raise ValueError(f"{spec.architecture} has no packed implementation in poolgate to compare")
        name = arch.implementation
    else:
        model, name = HfAutoEncoder(spec, allow_pickle=False).eval(), "transformers fallback (padded)"
    model = model.to(dtype=dtype)
    if packed:
        backend.optimize(model, dtype)
    weights = open_weights(spec, allow_pickle=False)
    # embedders: no head reads a tokenizer
    pooler = poolers_for(spec, backend.device(), weights=weights, tokenizer=None, ops=backend.ops(dtype))
    weights.close()
    return PoolingRunner(model=model, backend=backend, dtype=dtype, pooler=pooler), name


def _interleaved(runners: list, work: list[list[list[int]]]) -> tuple[list[float], list[np.ndarray]]:
    """Seconds per runner over all of ``work``, each batch run by every runner in turn (so load from other
    processes falls on both alike), after an untimed warm-up on a few texts; and each one's batch-1 vectors."""
    from poolgate.shared.domain.params import PoolingParams
    from poolgate.workers.engine.sequence import Sequence

    params = PoolingParams(task="embed")
    for r in runners:
        r.run([Sequence(s, params) for s in work[0][:WARM_UP_TEXTS]])
    seconds, firsts = [0.0] * len(runners), [None] * len(runners)
    for n, batch in enumerate(work):
        for i, r in enumerate(runners):
            start = time.perf_counter()
            outputs = r.run([Sequence(s, params) for s in batch])
            seconds[i] += time.perf_counter() - start
            if n == 0:
                firsts[i] = np.concatenate([o.rows.values for o in outputs])
    return seconds, firsts


def run(cfg: BenchConfig) -> dict:
    """Both paths on the same batches; a JSON-able report."""
    from poolgate.workers.backends import get_backend

    get_backend("cpu").setup(cfg.num_threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
    ids = corpus_ids(cfg.num_texts, cfg.seed, cfg.max_len, cfg.sort)
    work = batches(ids, cfg.batch_tokens)
    tokens = sum(len(s) for s in ids)
    with tempfile.TemporaryDirectory(prefix="poolgate-bench-arch-") as tmp:
        architecture = make_checkpoint(Path(tmp), cfg.family, cfg.shape, cfg.seed)
        built = [_runner(Path(tmp), dtype, packed, cfg.max_len) for packed in (True, False)]
    seconds, firsts = _interleaved([r for r, _ in built], work)
    results = [PathResult(name, t, tokens) for (_, name), t in zip(built, seconds)]
    a, b = firsts
    cosine = float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())
    packed, fallback = results
    return {
        "family": cfg.family, "shape": cfg.shape, "architecture": architecture, "dtype": cfg.dtype,
        "threads": torch.get_num_threads(), "texts": len(ids), "tokens": tokens, "batches": len(work),
        "batch_tokens": cfg.batch_tokens, "order": "length-sorted" if cfg.sort else "fifo",
        "packed": {"implementation": packed.implementation, "seconds": round(packed.seconds, 3),
                   "tokens_per_s": round(packed.tokens_per_s, 1)},
        "fallback": {"implementation": fallback.implementation, "seconds": round(fallback.seconds, 3),
                     "tokens_per_s": round(fallback.tokens_per_s, 1)},
        "speedup": round(packed.tokens_per_s / fallback.tokens_per_s, 3),
        "worst_cosine_first_batch": round(cosine, 6),
    }
