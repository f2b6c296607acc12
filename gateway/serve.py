"""``poolgate serve``: its flags, parsed once into a frozen GatewayConfig, then ``run_gateway``."""
from __future__ import annotations

import argparse
import asyncio
import logging

from poolgate.gateway.launch import run_gateway
from poolgate.shared.config import BACKEND_CHOICES, DTYPE_CHOICES, SEQ_POOLING_TYPES, GatewayConfig, WorkerConfig
from poolgate.shared.models import resolve_model

log = logging.getLogger("poolgate")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="local model folder (HF or sentence-transformers layout); default: bundled all-MiniLM-L6-v2")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="auto: fastest dtype whose vectors stay at cosine >= 0.999 to float32")
    p.add_argument("--served-model-name", default=None, help="name clients use (default: MODEL as given)")
    p.add_argument("--max-model-len", type=positive_int, default=None, help="longest input in tokens")
    p.add_argument("--max-batch-tokens", type=positive_int, default=None,
                   help="token budget of one batch (default: 8192 on CPU, 32768 on CUDA/ROCm, 16384 on XPU)")
    p.add_argument("--auto-truncate", action="store_true",
                   help="truncate over-long inputs instead of rejecting them with 400")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 and /v2 routes")
    p.add_argument("--pooling-type", type=str.upper, choices=SEQ_POOLING_TYPES, default=None,
                   help="override the model's pooling")
    p.add_argument("--no-normalize", dest="normalize", action="store_false", default=None,
                   help="do not L2-normalize embeddings by default")
    p.add_argument("--allow-pickle-weights", action="store_true",
                   help="allow loading pytorch_model.bin (pickle) when no safetensors exist")
    p.add_argument("--workers", type=positive_int, default=1, help="local worker processes for the model")
    p.add_argument("--num-threads", type=positive_int, default=None,
                   help="torch threads per worker (default: physical cores)")
    p.add_argument("--transport", choices=("unix", "tcp"), default="unix", help="gateway<->local worker transport")
    p.add_argument("--worker-url", action="append", default=[],
                   help="a running worker to use instead of spawning one: tcp://host:port or unix:/path")
    p.add_argument("--startup-timeout", type=positive_float, default=600.0,
                   help="seconds a worker may take to load and report ready")
    p.add_argument("--max-inputs-per-request", type=positive_int, default=2048,
                   help="inputs one request may carry (OpenAI's limit is 2048)")
    p.add_argument("--request-timeout", type=positive_float, default=600.0,
                   help="seconds before an unfinished request gets 504 and is cancelled in the worker")
    p.add_argument("--max-in-flight-per-worker", type=positive_int, default=None,
                   help="calls in flight per worker before new ones get 429 (default: no cap)")
    p.add_argument("--log-level", default="INFO")


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    workers: tuple[WorkerConfig, ...] = ()
    if not args.worker_url:
        path, name = resolve_model(args.model)
        worker = WorkerConfig(
            model_path=path, served_model_name=args.served_model_name or name, backend=args.backend,
            dtype=args.dtype, max_model_len=args.max_model_len, max_batch_tokens=args.max_batch_tokens,
            allow_pickle_weights=args.allow_pickle_weights, pooling_type=args.pooling_type,
            normalize=args.normalize, num_threads=args.num_threads,
        )
        workers = (worker,) * args.workers
    return GatewayConfig(
        host=args.host, port=args.port, api_key=args.api_key, auto_truncate=args.auto_truncate,
        transport=args.transport, worker_urls=tuple(args.worker_url), workers=workers,
        startup_timeout_s=args.startup_timeout, max_inputs_per_request=args.max_inputs_per_request,
        request_timeout_s=args.request_timeout, max_in_flight_per_worker=args.max_in_flight_per_worker,
    )


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except (FileNotFoundError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    return asyncio.run(run_gateway(config))
