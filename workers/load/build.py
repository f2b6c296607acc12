"""Loads one model for serving: spec, backend, token budget, dtype, then the runner, built once.

Every choice is made before the runner exists: the backend and its token
budget, then the dtype. The checkpoint is opened once (``workers.load.checkpoint``)
and read by the model and its heads alike, with the worker's one tokenizer.
``--dtype auto`` runs the probe texts through the model in fp32, casts that same
model to the backend's fast dtype (with its final kernels) and keeps it only
if every probe vector stays at cosine ≥ 0.999 and, on a CPU, it is not slower
than fp32 on one timed batch (``workers.load.auto_speed``); the runner that is
kept is used as it was built.
Chunked processing of long embed inputs (``--pooler-config``) is checked
against the built poolers: it needs the embed task pooled with MEAN.
"""
from __future__ import annotations

import logging
import time
from dataclasses import fields

import numpy as np
import torch
from torch import nn

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import ModelInfo
from poolgate.workers.backends import get_backend
from poolgate.workers.backends.base import Backend
from poolgate.workers.load.auto_speed import keeps_fast, timing_batch, tokens_per_s
from poolgate.workers.load.inspect import plan, settled
from poolgate.workers.load.pylate import pylate_config, read_settings
from poolgate.workers.load.checkpoint import Tensors
from poolgate.workers.load.lora import adapter_names
from poolgate.workers.load.media_build import load_media, media_family_of
from poolgate.workers.models import Architecture, architecture_for, build_model, open_weights
from poolgate.workers.models.hf_auto import check_supported
from poolgate.workers.models.run_loras import RunLoras
from poolgate.workers.pooling.for_model import poolers_for
from poolgate.workers.engine.chunked_prefill import for_model as chunked_prefill_for
from poolgate.workers.engine.prefix_cache import for_model as prefix_cache_for
from poolgate.workers.engine.cuda_graphs import graphs_for
from poolgate.workers.engine.runner import PoolingRunner
from poolgate.workers.engine.runner_api import LoadedModel
from poolgate.shared.inputs.score_templates import template_for
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.st_config import ModelSpec, read_prompts, read_spec
from poolgate.shared.inputs.tokenizer import TextEncoder
from poolgate.workers.load.hf_tokenizer import files_of, read_tokenizer

log = logging.getLogger("poolgate.worker")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
AUTO_MIN_COSINE = 0.999
# the Ops fields a built model does not hold: its last changes, the group plan, the poolers' pooling ops
AFTER_BUILD = ("finalize", "plans_groups", "pooling", "kept_mean", "kept_rows", "l2_cut")
PROBE_TEXTS = (
    "a", "Hello world!", "The quick brown fox jumps over the lazy dog.",
    "Pooling models turn the hidden states of a whole prompt into one vector. " * 6,
    "12345 67890 !!! ??? ... ---", "Zürich, München, São Paulo, Kraków, Ångström",
)


def _model(spec: ModelSpec, cfg: WorkerConfig, backend: Backend, weights: Tensors,
           dtype: torch.dtype) -> tuple[nn.Module, Architecture]:
    """The model built from the open ``weights`` with the backend's ops for ``dtype``, cast and moved."""
    model, arch = build_model(spec, backend.ops(dtype), weights=weights, allow_pickle=cfg.allow_pickle_weights,
                              trust_remote_code=cfg.trust_remote_code, allow_partial=cfg.allow_partial_weights)
    return model.to(device=backend.device(), dtype=dtype), arch


def _pooling_dtype(cfg: WorkerConfig, backend: Backend) -> torch.dtype:
    """The dtype whose ops bundle the poolers get: the one asked for, for ``auto`` the backend's fast one (the
    pooling kernels take hidden states in any dtype, so the fp32 probe runner pools with the same ops)."""
    return backend.fast_dtype() if cfg.dtype == "auto" else DTYPES[cfg.dtype]


def _castable(backend: Backend, built: torch.dtype, dtype: torch.dtype) -> bool:
    """Whether a model built for ``built`` runs as ``dtype`` once cast: the backend's ops for the two are
    the same but for ``finalize`` and the group plan (the CPU's; a GPU's flash attention for halves is
    built in, so there the model is built again)."""
    a, b = backend.ops(built), backend.ops(dtype)
    return all(getattr(a, f.name) == getattr(b, f.name) for f in fields(a) if f.name not in AFTER_BUILD)


def _runner(model: nn.Module, arch: Architecture, backend: Backend, dtype: torch.dtype, pooler,
            *, final: bool = True) -> PoolingRunner:
    """A runner over ``model`` in ``dtype``; ``final``: the backend's last changes first (prepacking)."""
    if final:
        backend.optimize(model, dtype)
    return PoolingRunner(model=model, backend=backend, dtype=dtype, pooler=pooler,
                         grouped=bool(getattr(model, "needs_groups", False)))


def _vectors(runner: PoolingRunner, ids: list[list[int]]) -> np.ndarray:
    """(rows, dim) outputs of the model's active task for ``ids``."""
    params = PoolingParams(task=runner.pooler.tasks[0])
    outputs = runner.run([Sequence(x, params) for x in ids])
    return np.concatenate([o.rows.values for o in outputs])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _worst_cosine(got: np.ndarray, want: np.ndarray) -> float | None:
    """The probes' worst row cosine; one-column rows (a reward model's scores) compared as one vector of
    scores; None when the active task kept no rows of the probes (STEP rows at a tag they do not contain)."""
    if want.size == 0:
        return None
    if want.shape[1] < 2:
        got, want = got.reshape(1, -1), want.reshape(1, -1)
    return float(_cosines(got, want).min())


def _choose_runner(spec: ModelSpec, cfg: WorkerConfig, backend: Backend, weights: Tensors, pooler,
                   probes: list[list[int]]) -> PoolingRunner:
    """The runner in the requested dtype, or for ``auto`` the fast one if the probes allow it: the model is
    built once in fp32 for the reference vectors and cast to the fast dtype where the backend builds both
    alike (``_castable``); else, and after a drift (the cast dropped the low bits), it is built again from
    the still-open checkpoint."""
    if cfg.dtype != "auto":
        return _runner(*_model(spec, cfg, backend, weights, DTYPES[cfg.dtype]), backend, DTYPES[cfg.dtype], pooler)
    model, arch = _model(spec, cfg, backend, weights, torch.float32)
    fast = backend.fast_dtype()
    if fast == torch.float32:
        return _runner(model, arch, backend, fast, pooler)
    reference = _runner(model, arch, backend, torch.float32, pooler, final=False)
    want = _vectors(reference, probes)
    if want.size == 0:
        log.warning("dtype auto: the start-up probes give no %s rows to compare; staying in float32",
                    pooler.tasks[0])
        return _runner(model, arch, backend, torch.float32, pooler)
    timed = timing_batch(probes, spec.max_model_len) if backend.times_auto_dtype else None
    fp32_tps = tokens_per_s(reference, timed) if timed else None
    if _castable(backend, torch.float32, fast):
        model = model.to(dtype=fast)  # one parameter at a time: never the model twice in memory
    else:
        del model
        backend.release_memory()
        model, arch = _model(spec, cfg, backend, weights, fast)
    candidate = _runner(model, arch, backend, fast, pooler)
    worst = _worst_cosine(_vectors(candidate, probes), want) or 0.0
    name = str(fast).removeprefix("torch.")
    if worst < AUTO_MIN_COSINE:
        log.warning("dtype auto: %s drifts to cosine %.5f; staying in float32", name, worst)
    elif timed is None or fp32_tps is None:
        log.info("dtype auto: %s (worst probe cosine to float32 %.6f)", name, worst)
        return candidate
    else:
        fast_tps = tokens_per_s(candidate, timed)
        speeds = f"{name} {fast_tps:,.0f} tokens/s, float32 {fp32_tps:,.0f} (before its prepacking)"
        if keeps_fast(fast_tps, fp32_tps, sum(map(len, timed))):
            log.info("dtype auto: %s (worst probe cosine to float32 %.6f; timed here: %s)", name, worst, speeds)
            return candidate
        log.warning("dtype auto: float32: %s runs slower than float32 on this CPU (timed here: %s; "
                    "docs/operations.md#cpu-classes)", name, speeds)
    del candidate, model  # never two copies of the model on the device at once
    backend.release_memory()
    return _runner(*_model(spec, cfg, backend, weights, torch.float32), backend, torch.float32, pooler)


def _check_chunking(pooler) -> None:
    """Refuse ``enable_chunked_processing`` unless embed pools with MEAN (``workers.engine.chunking``)."""
    embed = pooler.poolers.get("embed")
    if embed is None:
        raise ValueError("--pooler-config enable_chunked_processing applies to the embed task, which this "
                         f"model does not serve (it serves {', '.join(pooler.tasks)})")
    if embed.pool is not None or embed.method != "MEAN":
        raise ValueError(
            f"--pooler-config enable_chunked_processing needs MEAN pooling, but this model pools embed "
            f"with {embed.method}: the token-weighted mean of chunk embeddings only equals the embedding of "
            "the whole input for MEAN. Set \"pooling_type\": \"MEAN\" in --pooler-config if the model "
            "suits it, or leave chunked processing off.")
    if embed.selects_rows:  # GritLM: the instruction is the first chunk's only
        raise ValueError("--pooler-config enable_chunked_processing: this model's embed averages only the tokens "
                         "after its instruction, which a later chunk does not have; leave chunked processing off")


def _warm_up(runner: PoolingRunner, encoder: TextEncoder, longest: int, budget: int) -> None:
    """Run a few batch shapes once so kernels are chosen before the first request."""
    ids = encoder.encode([" ".join(["warm up"] * longest)], max_tokens=longest)[0]
    shapes = [(1, 8), (8, 64), (max(1, budget // longest), longest)]
    params = PoolingParams(task=runner.pooler.tasks[0])
    for i, (n, length) in enumerate(shapes, 1):
        log.info("warming up [%d/%d]: %d x %d tokens", i, len(shapes), n, min(length, len(ids)))
        runner.run([Sequence(ids[:length], params) for _ in range(n)])
    runner.backend.synchronize()


def _budget(backend: Backend, runner: PoolingRunner, hf_config: dict, replicas: int) -> int:
    """The default token budget (``Backend.batch_tokens``: a GPU's from its memory), logged with its reason."""
    tokens, why = backend.batch_tokens(runner.model, runner.dtype, hf_config, replicas)
    log.info("token budget: %s (%s; --max-batch-tokens sets it)", tokens, why)
    return tokens


def load_model(cfg: WorkerConfig) -> LoadedModel:
    """Everything the worker needs before it reports ready; logs each step."""
    family = media_family_of(cfg)
    if family is not None:  # images or audio in (workers.models.media)
        loaded = load_media(cfg, family)
        if cfg.verify_on_start is not None:  # its towers against transformers (workers.tools.verify_media)
            from poolgate.workers.tools.verify_media import refuse_media_below

            refuse_media_below(loaded, cfg.model, cfg.verify_on_start)
            log.info("verify on start: every tower agrees with its reference at cosine >= %s", cfg.verify_on_start)
        return loaded
    start = time.perf_counter()
    spec = read_spec(cfg)
    backend = get_backend(cfg.backend)
    backend.setup(cfg.num_threads, cfg.cpu_affinity)
    arch = architecture_for(spec)
    log.info("model %s: %s on %s (%s)", cfg.served_model_name, spec.architecture, backend.name, arch.implementation)
    tokenizer = read_tokenizer(spec.path, gguf_file=spec.gguf_file, trust_remote_code=cfg.trust_remote_code)
    roles = read_settings(spec, tokenizer) if pylate_config(spec) is not None else None  # PyLate: inputs by role
    encoder = TextEncoder(files_of(tokenizer, do_lower_case=spec.do_lower_case,
                                   score_template=template_for(spec.hf_config), roles=roles))
    probes = encoder.encode(list(PROBE_TEXTS), max_tokens=spec.max_model_len)
    if not arch.packed:
        check_supported(spec, cfg.trust_remote_code)  # before looking for weights it could not run
    weights = open_weights(spec, allow_pickle=cfg.allow_pickle_weights)  # the one read, shared by model and heads
    try:
        pooler = poolers_for(spec, backend.device(), weights=weights, tokenizer=tokenizer,
                             allow_pickle=cfg.allow_pickle_weights, ops=backend.ops(_pooling_dtype(cfg, backend)))
        runner = _choose_runner(spec, cfg, backend, weights, pooler, probes)
    finally:
        weights.close()
    runner.prefix_cache = prefix_cache_for(runner.model, runner.pooler, cfg.prefix_cache_mb << 20,
                                           dtype=runner.dtype, group_attention=runner.group_attention)
    if hasattr(runner, "chunked_prefill"):
        runner.chunked_prefill = chunked_prefill_for(runner.model, runner.pooler, group_attention=runner.group_attention)
    if spec.pooler.enable_chunked_processing:
        _check_chunking(runner.pooler)
    if cfg.max_loras:  # run-time LoRA adapters (workers.models.run_loras): slots on the packed model
        if arch.family is None:
            raise ValueError(f"--max-loras: {spec.architecture} runs through transformers (padded); run-time LoRA "
                             "adapters apply only to packed families")
        runner.adapters = RunLoras(runner.model, max_loras=cfg.max_loras, max_rank=cfg.max_lora_rank,
                                   prefixes=arch.family.prefixes)
    budget = cfg.max_batch_tokens or _budget(backend, runner, spec.hf_config, cfg.replicas_per_device)
    labels, out_dim = runner.pooler.labels, runner.pooler.out_dim
    dim = out_dim or (spec.dense[-1].out_features if spec.dense else int(runner.model.hidden_size))
    if spec.pooler.dimensions is not None and (spec.kind != "embed" or out_dim):
        raise ValueError("pooler config dimensions applies to dense embeddings; this model's outputs "
                         "(classes, or SPLADE's vocabulary weights) cannot be sliced")
    if spec.pooler.dimensions is not None:
        if not spec.is_matryoshka or spec.pooler.dimensions > dim:
            raise ValueError(f"pooler config dimensions={spec.pooler.dimensions} needs a Matryoshka model "
                             f"(is_matryoshka or matryoshka_dimensions) of at least that size")
        dim = spec.pooler.dimensions
    report = backend.report(runner.dtype, cfg.device)
    if cfg.cuda_graphs:  # --cuda-graphs (workers.engine.cuda_graphs): captured at warm-up and as shapes come
        attention = getattr(backend.attention(runner.dtype), "__name__", "")
        runner.graphs, why = graphs_for(runner.model, backend.name, attention, budget, spec.max_model_len,
                                        packed=arch.packed, grouped=runner.group_attention)
        report["kernels"] = {**report["kernels"], "cuda_graphs": why or runner.graphs.reason()}
    info = ModelInfo(
        served_model_name=cfg.served_model_name, architecture=spec.architecture, tasks=runner.pooler.tasks,
        max_model_len=spec.max_model_len, embedding_dim=dim, backend=backend.name,
        dtype=str(runner.dtype).removeprefix("torch."), is_matryoshka=spec.is_matryoshka,
        matryoshka_dimensions=spec.matryoshka_dimensions, vocab_size=spec.hf_config.get("vocab_size"),
        labels=labels, chunked_processing=spec.pooler.enable_chunked_processing,
        max_embed_len=spec.pooler.max_embed_len, **report,
        prompts=read_prompts(spec.path, spec.hf_config), chat_template=bool(encoder.chat_template),
        input_roles=encoder.roles is not None, adapters=adapter_names(spec.architecture, spec.hf_config),
        tokenizer_sha256=encoder.files.sha256, max_loras=cfg.max_loras,
    )
    table = settled(plan(cfg, backend, spec), spec, backend, tasks=info.tasks, dtype=runner.dtype).table()
    for line in table.splitlines():  # the table `poolgate inspect` prints, as loading settled it
        log.info("%s", line)
    if info.chunked_processing:
        log.info("chunked processing: embed inputs over %d tokens run in chunks (input cap: %s)",
                 info.max_model_len, info.max_embed_len or "none")
    _warm_up(runner, encoder, info.max_model_len, budget)
    if runner.graphs is not None:
        log.info("cuda graphs: %s", runner.graphs.reason())
    log.info("model ready in %.1f s", time.perf_counter() - start)
    memory = backend.memory if backend.memory() else None
    loaded = LoadedModel(info=info, encoder=encoder, runner=runner, max_batch_tokens=budget, device_memory=memory,
                         padded=not arch.packed, cache_bytes=cfg.embedding_cache_mb << 20)
    if cfg.verify_on_start is not None:  # refuse to serve below the threshold (workers.tools.verify)
        from poolgate.workers.tools.verify import refuse_below

        refuse_below(loaded, spec, cfg.verify_on_start)
        log.info("verify on start: every task agrees with its reference at cosine >= %s", cfg.verify_on_start)
    return loaded
