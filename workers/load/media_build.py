"""Loads a media model (``workers.models.media``): its family builds it; served as every model is.

``media_family_of`` says whether a folder holds one (its config's first
architecture is in ``MEDIA_ARCHITECTURES``); ``load_media`` builds it on the
worker's backend in the asked dtype (``auto``: float32, the dtype its
reference vectors are checked in; ``bfloat16`` where asked), wraps it in the
usual runner and reports its ``ModelInfo`` with the modalities it takes. Its
batches are padded (transformers' own forward), so the engine's budget
counts a batch as count × longest, image placeholders included.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.inputs.encoders import encoder_for
from poolgate.shared.wire.messages import ModelInfo
from poolgate.workers.backends import get_backend
from poolgate.workers.engine.runner import PoolingRunner
from poolgate.workers.engine.runner_api import LoadedModel
from poolgate.workers.models.media import MediaFamily, MediaSource
from poolgate.workers.models.media.families import media_family

log = logging.getLogger("poolgate.worker")
DTYPES = {"auto": torch.float32, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_MEDIA_BATCH_TOKENS = 16384  # padded batches: a few 224 px images and their texts, or one page's patches


def read_config(cfg: WorkerConfig) -> dict[str, Any] | None:
    """The folder's config.json with ``--hf-overrides`` applied; None where there is none (a GGUF file)."""
    path = Path(cfg.model) / "config.json"
    if not path.is_file():
        return None
    return {**json.loads(path.read_text()), **cfg.hf_overrides}


def media_family_of(cfg: WorkerConfig) -> MediaFamily | None:
    """The media family serving ``cfg.model``, None for a text model."""
    hf = read_config(cfg)
    return media_family(hf) if hf is not None else None


def _vocab_size(hf: dict[str, Any]) -> int | None:
    """The text model's vocabulary (token ids past it are a 400, never a 500 in a batch): the config's own, else
    its nearest nested config's (``text_config``, ``vlm_config.text_config``, ...); None where none says."""
    todo: list[dict[str, Any]] = [hf]
    while todo:
        config = todo.pop(0)
        if isinstance(config.get("vocab_size"), int):
            return int(config["vocab_size"])
        todo += [v for k, v in config.items() if isinstance(v, dict) and k.endswith("config")]
    return None


def load_media(cfg: WorkerConfig, family: MediaFamily) -> LoadedModel:
    """Everything the worker needs to serve a media model (module doc); logs each step."""
    start = time.perf_counter()
    hf = read_config(cfg)
    assert hf is not None
    backend = get_backend(cfg.backend)
    backend.setup(cfg.num_threads, cfg.cpu_affinity)
    dtype = DTYPES[cfg.dtype]
    architecture = hf["architectures"][0]
    log.info("model %s: %s on %s (media: %s)", cfg.served_model_name, architecture, backend.name,
             family.implementation)
    source = MediaSource(Path(cfg.model), hf, architecture, dtype, backend.device(), backend.ops(dtype), cfg)
    built = family.build(source)
    model = built.model.to(device=backend.device(), dtype=dtype).eval()
    runner = PoolingRunner(model=model, backend=backend, dtype=dtype, pooler=built.pooler)
    encoder = encoder_for(built.files)
    budget = cfg.max_batch_tokens or max(DEFAULT_MEDIA_BATCH_TOKENS, built.max_model_len)
    info = ModelInfo(
        served_model_name=cfg.served_model_name, architecture=architecture, tasks=runner.pooler.tasks,
        max_model_len=built.max_model_len, embedding_dim=built.embedding_dim, backend=backend.name,
        dtype=str(dtype).removeprefix("torch."), labels=built.labels, **backend.report(dtype, cfg.device),
        chat_template=bool(encoder.chat_template), tokenizer_sha256=encoder.files.sha256,
        modalities=built.modalities, vocab_size=_vocab_size(hf),
    )
    if built.warm_up is not None:
        built.warm_up(runner)
        backend.synchronize()
    log.info("model ready in %.1f s (%s; modalities %s; token budget %d)", time.perf_counter() - start,
             info.dtype, ", ".join(info.modalities), budget)
    memory = backend.memory if backend.memory() else None
    return LoadedModel(info=info, encoder=encoder, runner=runner, max_batch_tokens=budget, device_memory=memory,
                       padded=True, cache_bytes=cfg.embedding_cache_mb << 20)
