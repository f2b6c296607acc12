"""The model settings, declared once: each one's type, default, bounds and help, whence its flag and its file key.

``ModelSettings`` is the one declaration (as vLLM's ``EngineArgs``), each
field a setting as ``shared.config.declare`` says. From it, ``shared.config.model_flags``
derives the argparse flags, ``gateway.config.file`` the pydantic model of a
``[[models]]`` table, and ``shared.config.frozen.WorkerConfig`` extends it (the
settings, resolved, plus the worker process's own fields). A setting added
here is a flag, a file key and a WorkerConfig field with nothing else to edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from poolgate.shared.config.declare import setting
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.shared.domain.media_limits import MediaLimits

Backend = Literal["auto", "cpu", "cuda", "rocm", "xpu"]
DType = Literal["auto", "float32", "float16", "bfloat16"]
Runner = Literal["auto", "pooling"]  # --runner (workers.load.convert)
Convert = Literal["auto", "none", "embed", "classify"]  # --convert (workers.load.convert)
BatchPolicy = Literal["fair", "fifo"]  # --batch-policy (workers.engine.scheduler.POLICIES)
SeqPoolingType = Literal["CLS", "MEAN", "LAST"]  # --pooling-type: the sequence methods of workers.pooling.methods

BACKEND_CHOICES: tuple[Backend, ...] = get_args(Backend)
DTYPE_CHOICES: tuple[DType, ...] = get_args(DType)
SEQ_POOLING_TYPES: tuple[SeqPoolingType, ...] = get_args(SeqPoolingType)
MEDIA = "media inputs (images and audio)"  # their --help group (shared.domain.media_limits)
_MEDIA = MediaLimits()  # the limits' defaults are the flags'


@dataclass(frozen=True)
class ModelSettings:
    """MODEL and every setting that says how a worker loads and serves it, in the order of ``--help``."""

    model: str | None = setting(
        positional=True,
        path=True,
        help="local model folder (HF or sentence-transformers layout); default: bundled all-MiniLM-L6-v2",
    )
    served_model_name: str | None = setting(file_key="name", help="name clients use (default: MODEL as given)")
    backend: Backend = setting("auto")
    dtype: DType = setting("auto", help="auto: fastest dtype whose vectors stay at cosine >= 0.999 to float32")
    max_model_len: int | None = setting(ge=1, help="longest input in tokens")
    max_batch_tokens: int | None = setting(
        ge=1,
        help="token budget of one batch (default: 8192 on CPU, 16384 on XPU; CUDA/ROCm: from the GPU's memory, "
        "the model's size and --replicas-per-device, 2048 to 65536, logged at start)",
    )
    replicas_per_device: int = setting(
        1,
        ge=1,
        metavar="N",
        help="cuda/rocm/xpu: start N workers on each device (replicas = devices x N), each with its share of the "
        "device's memory in its default token budget; several processes keep one GPU busier than one",
    )
    cuda_graphs: bool = setting(
        False,
        help="cuda with varlen flash attention: run batches as CUDA graphs captured per token bucket (few kernel "
        "launches per forward); a batch or model the graphs cannot take runs eagerly (see poolgate inspect)",
    )
    pooler_config: PoolerConfig = setting(
        factory=PoolerConfig,
        table=PoolerConfig.from_dict,
        help='vLLM\'s PoolerConfig as JSON, e.g. \'{"pooling_type": "MEAN", "use_activation": false}\'',
    )
    hf_overrides: dict[str, Any] = setting(
        factory=dict,
        table=dict,
        help="JSON merged over the model's config.json, e.g. '{\"matryoshka_dimensions\": [64, 128]}'",
    )
    runner: Runner = setting("auto", help="pooling: serve even a generative checkpoint (as embed); auto: vLLM's rules")
    convert: Convert = setting("auto", help="embed: last-token embeddings from a decoder; classify: add a score layer")
    pooling_type: SeqPoolingType | None = setting(
        upper=True, help="alias of --pooler-config '{\"seq_pooling_type\": ...}'"
    )
    normalize: bool | None = setting(
        negative="--no-normalize", help="alias of --pooler-config '{\"use_activation\": false}'"
    )
    allow_pickle_weights: bool = setting(
        False, help="allow loading pytorch_model.bin (pickle) when no safetensors exist"
    )
    allow_partial_weights: bool = setting(
        False,
        help="serve a transformers-fallback model whose checkpoint has tensors missing, unexpected or "
        "mis-shaped (refused by default; the log names what was dropped or left random)",
    )
    verify_on_start: float | None = setting(
        gt=0,
        le=1,
        const=0.999,
        metavar="MIN_COSINE",
        help="after loading, run poolgate verify's probes against the model's own library and refuse to serve "
        "when a worst cosine is below MIN_COSINE (default 0.999)",
    )
    trust_remote_code: bool = setting(
        False, help="let the transformers fallback run the model's own Python code (config auto_map)"
    )
    num_threads: int | None = setting(
        ge=1,
        help="CPU: run every batch whole on one team of this many torch threads (default: one "
        "single-threaded core thread per physical core, each batch cut into a part per core thread)",
    )
    tokenizer_threads: int | None = setting(
        None,
        ge=1,
        metavar="N",
        help="threads that tokenize requests in front of the queue, in each gateway process (the most any model "
        "asks for) and in the offline API; default: one per CPU, 2 to 8 (the fast tokenizer's batch call releases "
        "the GIL, so one huge input's tokenizing does not hold up a small request's)",
    )
    embedding_cache_mb: int = setting(
        0,
        ge=0,
        metavar="MB",
        help="keep up to MB of pooled outputs in memory per worker, keyed by pooling params and token ids, and "
        "answer repeated inputs from it (bit-identical; hits and misses in /metrics); 0 = off",
    )
    prefix_cache_mb: int = setting(
        256,
        ge=0,
        metavar="MB",
        help="causal decoders (LAST-pooled tasks: embed, classify, score): keep up to MB of attention keys and "
        "values per worker in blocks of 16 tokens, keyed by the token prefix, so inputs that share a prefix "
        "(a rerank call's query, an embedder's instruction) compute it once; 0 = off",
    )
    max_tokens_per_request: int | None = setting(
        ge=1,
        metavar="TOKENS",
        help="tokens one request's inputs may have in all, counted by the model's tokenizer; more is a 400 "
        "before anything runs (default: no limit)",
    )
    allowed_media_domains: list[str] = setting(
        factory=list,
        several=True,
        metavar="HOST",
        group=MEDIA,
        help="fetch http(s) image and audio URLs from these exact host names (no wildcards); a host that "
        "resolves to a private, loopback, link-local or other non-global address is refused unless that "
        "address is listed too (e.g. images.internal 10.0.0.7); default: none, only data: URLs and base64",
    )
    max_images_per_request: int = setting(
        _MEDIA.max_images_per_request,
        ge=1,
        metavar="N",
        group=MEDIA,
        help="images and audio clips one request may hold in all; more is a 400 before any is fetched or decoded",
    )
    max_image_pixels: int = setting(
        _MEDIA.max_image_pixels,
        ge=1,
        metavar="PIXELS",
        group=MEDIA,
        help="width x height one image may have, read from its header before it is decoded (a decompression "
        "bomb is a 400, never decoded)",
    )
    max_media_bytes: int = setting(
        _MEDIA.max_media_bytes,
        ge=1,
        metavar="BYTES",
        group=MEDIA,
        help="encoded bytes one image or audio clip may have, sent inline or fetched (a fetch stops there)",
    )
    max_audio_seconds: float = setting(
        _MEDIA.max_audio_seconds,
        gt=0,
        metavar="SECONDS",
        group=MEDIA,
        help="seconds one audio clip may last, read from its header before its samples are decoded",
    )
    max_loras: int = setting(
        0,
        ge=0,
        metavar="N",
        help="run-time LoRA adapters resident at once on a packed model; "
        "loading one more is refused until one is unloaded; 0 = adapters off",
    )
    max_lora_rank: int = setting(16, ge=1, metavar="RANK", help="the highest LoRA rank an adapter may have")
    batch_policy: BatchPolicy = setting(
        "fair",
        help="fair: priority lanes with aging, round robin over requests, short batches under mixed load; "
        "fifo: first in, first out (the most throughput, no fairness); both run bulk requests "
        "(X-Poolgate-Lane: bulk) after every live one",
    )
