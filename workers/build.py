"""Builds a ready PoolingRunner from a WorkerConfig: spec, backend, weights, dtype, warm-up."""
from __future__ import annotations

import copy
import logging
import time

import torch

from poolgate.shared.config import WorkerConfig
from poolgate.shared.wire import ModelInfo
from poolgate.workers.backends import get_backend
from poolgate.workers.models import build_model
from poolgate.workers.pooling.head import EmbedHead, load_dense
from poolgate.workers.pooling.methods import POOLING_TYPES
from poolgate.workers.runner import PoolingRunner
from poolgate.workers.st_config import read_spec
from poolgate.workers.tokenizer import TextEncoder

log = logging.getLogger("poolgate.worker")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
AUTO_MIN_COSINE = 0.999
PROBE_TEXTS = (
    "a", "Hello world!", "The quick brown fox jumps over the lazy dog.",
    "Pooling models turn the hidden states of a whole prompt into one vector. " * 6,
    "12345 67890 !!! ??? ... ---", "Zürich, München, São Paulo, Kraków, Ångström",
)


def _set_dtype(runner: PoolingRunner, model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast, pick the attention for ``dtype`` and apply the backend's final optimizations."""
    runner.model, runner.dtype = model.to(dtype), dtype
    if hasattr(model, "attention"):
        model.attention = runner.backend.attention(dtype)
    runner.group_attention = runner.backend.uses_groups(dtype)
    runner.backend.optimize(model, dtype)


def _choose_dtype(runner: PoolingRunner, requested: str) -> None:
    """Explicit dtypes are taken as given; ``auto`` keeps the fast dtype only if every
    probe vector stays at cosine ≥ 0.999 to fp32."""
    if requested != "auto":
        _set_dtype(runner, runner.model, DTYPES[requested])
        return
    fast = runner.backend.fast_dtype()
    if fast == torch.float32:
        _set_dtype(runner, runner.model, fast)
        return
    probes = runner.encode_texts(list(PROBE_TEXTS), max_tokens=runner.info.max_model_len)
    reference = runner.pooled(probes)
    fp32_model = runner.model
    _set_dtype(runner, copy.deepcopy(fp32_model), fast)
    worst = float(torch.nn.functional.cosine_similarity(runner.pooled(probes), reference).min())
    if worst >= AUTO_MIN_COSINE:
        log.info("dtype auto: %s (worst probe cosine to fp32 %.6f)", str(fast).removeprefix("torch."), worst)
        return
    log.warning("dtype auto: %s drifts to cosine %.5f; staying in float32", fast, worst)
    _set_dtype(runner, fp32_model, torch.float32)


def _warm_up(runner: PoolingRunner, max_batch_tokens: int) -> None:
    """Run a few batch shapes once so kernels are chosen before the first request."""
    longest = runner.info.max_model_len
    ids = runner.encode_texts([" ".join(["warm up"] * longest)], max_tokens=longest)[0]
    shapes = [(1, 8), (8, 64), (max(1, max_batch_tokens // longest), longest)]
    for i, (n, length) in enumerate(shapes, 1):
        log.info("warming up [%d/%d]: %d x %d tokens", i, len(shapes), n, min(length, len(ids)))
        runner.pooled([ids[:length]] * n)
    runner.backend.synchronize()


def build_runner(cfg: WorkerConfig) -> PoolingRunner:
    """Everything the worker needs before it reports ready; logs each step."""
    start = time.perf_counter()
    spec = read_spec(cfg)
    backend = get_backend(cfg.backend)
    backend.setup(cfg.num_threads)
    log.info("model %s: %s on %s", cfg.served_model_name, spec.architecture, backend.name)
    model, arch = build_model(spec, backend.attention(torch.float32), allow_pickle=cfg.allow_pickle_weights)
    device = backend.device()
    dense = [load_dense(d, allow_pickle=cfg.allow_pickle_weights) for d in spec.dense]
    projector = torch.nn.Sequential(*dense).to(device) if dense else None
    pooling = spec.pooling_type or arch.default_pooling
    normalize = True if spec.normalize is None else spec.normalize
    info = ModelInfo(
        served_model_name=cfg.served_model_name, architecture=spec.architecture, tasks=("embed",),
        max_model_len=spec.max_model_len,
        embedding_dim=spec.dense[-1].out_features if spec.dense else int(model.hidden_size),
        backend=backend.name, dtype="float32", is_matryoshka=spec.is_matryoshka,
        matryoshka_dimensions=spec.matryoshka_dimensions, vocab_size=spec.hf_config.get("vocab_size"),
    )
    runner = PoolingRunner(
        model=model.to(device), encoder=TextEncoder(spec.path, do_lower_case=spec.do_lower_case),
        backend=backend, dtype=torch.float32, method=POOLING_TYPES[pooling],
        head=EmbedHead(projector, normalize), info=info,
    )
    _choose_dtype(runner, cfg.dtype)
    runner.info = ModelInfo(**{**info.to_wire(), "dtype": str(runner.dtype).removeprefix("torch.")})
    log.info("pooling %s, normalize %s, max length %d, dtype %s, packed %s",
             pooling, normalize, spec.max_model_len, runner.info.dtype, arch.packed)
    runner.max_batch_tokens = cfg.max_batch_tokens or backend.default_batch_tokens
    _warm_up(runner, runner.max_batch_tokens)
    log.info("model ready in %.1f s", time.perf_counter() - start)
    return runner
