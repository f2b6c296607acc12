"""The model flags ``poolgate serve`` and ``poolgate worker`` share, parsed into one WorkerConfig.

Both commands call ``add_model_arguments`` and ``worker_config_from_args``, so a
model flag is defined once and the two cannot drift.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from poolgate.shared.config import (
    BACKEND_CHOICES,
    BATCH_POLICIES,
    CONVERT_CHOICES,
    DTYPE_CHOICES,
    RUNNER_CHOICES,
    SEQ_POOLING_TYPES,
    WorkerConfig,
)
from poolgate.shared.models import resolve_model
from poolgate.shared.pooler_config import PoolerConfig


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or a positive integer, got {text}")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (0-65535), got {text}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """MODEL and the flags that say how a worker loads and serves it."""
    g = parser.add_argument_group("model")
    g.add_argument("model", nargs="?", default=None,
                   help="local model folder (HF or sentence-transformers layout); default: bundled all-MiniLM-L6-v2")
    g.add_argument("--served-model-name", default=None, help="name clients use (default: MODEL as given)")
    g.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    g.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="auto: fastest dtype whose vectors stay at cosine >= 0.999 to float32")
    g.add_argument("--max-model-len", type=positive_int, default=None, help="longest input in tokens")
    g.add_argument("--max-batch-tokens", type=positive_int, default=None,
                   help="token budget of one batch (default: 8192 on CPU, 32768 on CUDA/ROCm, 16384 on XPU)")
    g.add_argument("--pooler-config", type=_pooler_config, default=PoolerConfig(),
                   help='vLLM\'s PoolerConfig as JSON, e.g. \'{"pooling_type": "MEAN", "use_activation": false}\'')
    g.add_argument("--hf-overrides", type=_json_object, default={},
                   help='JSON merged over the model\'s config.json, e.g. \'{"matryoshka_dimensions": [64, 128]}\'')
    g.add_argument("--runner", choices=RUNNER_CHOICES, default="auto",
                   help="pooling: serve even a generative checkpoint (as embed); auto: vLLM's rules")
    g.add_argument("--convert", choices=CONVERT_CHOICES, default="auto",
                   help="embed: last-token embeddings from a decoder; classify: add a score layer")
    g.add_argument("--pooling-type", type=str.upper, choices=SEQ_POOLING_TYPES, default=None,
                   help="alias of --pooler-config '{\"seq_pooling_type\": ...}'")
    g.add_argument("--no-normalize", dest="normalize", action="store_false", default=None,
                   help="alias of --pooler-config '{\"use_activation\": false}'")
    g.add_argument("--allow-pickle-weights", action="store_true",
                   help="allow loading pytorch_model.bin (pickle) when no safetensors exist")
    g.add_argument("--allow-partial-weights", action="store_true",
                   help="serve a transformers-fallback model whose checkpoint has tensors missing, unexpected or "
                        "mis-shaped (refused by default; the log names what was dropped or left random)")
    g.add_argument("--verify-on-start", type=_cosine, nargs="?", const=0.999, default=None, metavar="MIN_COSINE",
                   help="after loading, run poolgate verify's probes against the model's own library and refuse to "
                        "serve when a worst cosine is below MIN_COSINE (default 0.999)")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="let the transformers fallback run the model's own Python code (config auto_map)")
    g.add_argument("--num-threads", type=positive_int, default=None,
                   help="CPU: run every batch whole on one team of this many torch threads (default: one "
                        "single-threaded core thread per physical core, each batch cut into a part per core thread)")
    g.add_argument("--tokenizer-threads", type=positive_int, default=2, metavar="N",
                   help="threads that tokenize requests in each worker (the fast tokenizer's batch call releases "
                        "the GIL), so one huge input's tokenizing does not hold up a small request's")
    g.add_argument("--embedding-cache-mb", type=non_negative_int, default=0, metavar="MB",
                   help="keep up to MB of pooled outputs in memory per worker, keyed by pooling params and token "
                        "ids, and answer repeated inputs from it (bit-identical; hits and misses in /metrics); "
                        "0 = off")
    g.add_argument("--max-tokens-per-request", type=positive_int, default=None, metavar="TOKENS",
                   help="tokens one request's inputs may have in all, counted by the model's tokenizer; more is "
                        "a 400 before anything runs (default: no limit)")
    g.add_argument("--batch-policy", choices=BATCH_POLICIES, default="fair",
                   help="fair: priority lanes with aging, round robin over requests, short batches under mixed "
                        "load; fifo: first in, first out (the most throughput, no fairness)")


def _cosine(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a cosine in (0, 1], got {text}")
    return value


def _pooler_config(text: str) -> PoolerConfig:
    try:
        return PoolerConfig.from_json(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def pooler_config_from_args(args: argparse.Namespace) -> PoolerConfig:
    """--pooler-config with its alias flags folded in; ValueError when both say the same thing."""
    pooler, changes = args.pooler_config, {}
    if args.pooling_type is not None:
        if pooler.pooling_type or pooler.seq_pooling_type:
            raise ValueError("--pooling-type and --pooler-config's pooling type are both given")
        changes["seq_pooling_type"] = args.pooling_type
    if args.normalize is not None:
        if pooler.use_activation is not None:
            raise ValueError("--no-normalize and --pooler-config's use_activation are both given")
        changes["use_activation"] = args.normalize
    return replace(pooler, **changes) if changes else pooler


def worker_config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """The WorkerConfig the model flags describe; FileNotFoundError if the model folder is missing."""
    path, name = resolve_model(args.model)
    return WorkerConfig(
        model_path=path, served_model_name=args.served_model_name or name, backend=args.backend,
        dtype=args.dtype, max_model_len=args.max_model_len, max_batch_tokens=args.max_batch_tokens,
        allow_pickle_weights=args.allow_pickle_weights, trust_remote_code=args.trust_remote_code,
        allow_partial_weights=args.allow_partial_weights, verify_on_start=args.verify_on_start,
        pooler=pooler_config_from_args(args),
        hf_overrides=args.hf_overrides, runner=args.runner, convert=args.convert, num_threads=args.num_threads,
        tokenizer_threads=args.tokenizer_threads, embedding_cache_mb=args.embedding_cache_mb,
        batch_policy=args.batch_policy, max_tokens_per_request=args.max_tokens_per_request,
    )
