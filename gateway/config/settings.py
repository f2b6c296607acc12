"""The gateway's own settings, declared once: each is a ``poolgate serve`` flag and a top-level config file key.

``GatewaySettings`` declares them as ``shared.config.model_settings.ModelSettings``
declares the model's (``shared.config.declare``): ``gateway.serve`` adds a flag per
setting (``shared.config.flags``), in this order, and ``gateway.config.file`` makes
the file's top-level keys from the same fields (``file_key`` where the key is
not the name; a ``models_key`` setting is no top-level key but sets that key
of every ``[[models]]`` table). ``gateway.config.build`` turns the values into
the GatewayConfig. To add a serve setting, add a field here and read it in
``build_config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from poolgate.shared.config.declare import setting

LIMITS = "request limits (each over-limit request gets a 4xx naming the limit)"  # a --help group
GRPC = "gRPC (TEI's tei.v1 and the Open Inference Protocol; see docs/grpc.md)"  # a --help group
BATCH = "the Batch API (OpenAI's /v1/files and /v1/batches; see docs/batch.md)"  # a --help group


@dataclass(frozen=True)
class GatewaySettings:
    """Every ``poolgate serve`` setting that is not a model setting, tracing or worker security, in --help order."""

    host: str = setting("127.0.0.1")
    port: int = setting(8000, ge=0, le=65535)
    reuse_port: bool = setting(
        False,
        help="bind the port with SO_REUSEPORT, so several gateway processes (each with --worker-url to "
        "the same `poolgate worker`s) share it and the kernel spreads connections over them",
    )
    gateway_processes: int = setting(
        1,
        ge=1,
        metavar="N",
        aliases=("--api-server-count",),
        help="gateway processes on the one port (SO_REUSEPORT) in front of the same workers: this one spawns "
        "and supervises the local workers and N-1 more gateway processes, which connect to them; tenant quotas "
        "and /metrics are shared, admission takes 1/N of each limit per process (see docs/operations.md)",
    )
    auto_truncate: bool = setting(False, help="truncate over-long inputs instead of rejecting them with 400")
    api_key: str | None = setting(
        help="require 'Authorization: Bearer KEY' on every API and admin route (/health, /ping, "
        "/version, /metrics, /openapi.json and /docs stay open); default: $POOLGATE_API_KEY",
    )
    api_key_file: str | None = setting(metavar="FILE", path=True, help="read the API key from FILE")
    api_keys_file: str | None = setting(
        metavar="FILE",
        path=True,
        help="a TOML file of [[tenants]]: name, keys or key_sha256, priority, requests_per_minute, "
        "tokens_per_minute, max_concurrent (see docs/operations.md); any of its keys is accepted "
        "beside --api-key, and a tenant over its quota gets 429 with Retry-After",
    )
    model_root: list[str] = setting(
        factory=list,
        file_key="model_roots",
        path=True,
        metavar="DIR",
        help="a folder the admin API may load models from (repeatable; none: no loading)",
    )
    lora_modules: list[str] = setting(
        factory=list,
        metavar="NAME=PATH",
        help="a LoRA adapter served from the start (repeatable): NAME=PATH, or vLLM's JSON "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\' (or a list of them); its base model needs '
        "--max-loras (see docs/models.md)",
    )
    io_processor_plugin: str | None = setting(
        metavar="NAME",
        help="serve /pooling requests whose body has 'data' through this installed IO-processor plugin "
        "(entry point group poolgate.io_processor_plugins)",
    )
    workers: int = setting(1, ge=1, models_key="replicas", help="local worker processes for the model")
    transport: Literal["unix", "tcp"] = setting("unix", help="gateway<->local worker transport")
    worker_url: list[str] = setting(
        factory=list,
        models_key="remote",
        help="a running worker (poolgate worker) to use instead of spawning one: tcp://host:port, "
        "unix:/path, or dns+tcp://name:port (every address the name resolves to, re-resolved "
        "every 5 s: a Kubernetes headless Service); the model flags are then ignored",
    )
    startup_timeout: float = setting(600.0, gt=0, help="seconds a worker may take to load and report ready")
    max_request_bytes: int = setting(
        32 * 1024 * 1024,
        ge=1,
        group=LIMITS,
        metavar="BYTES",
        help="largest request body; a bigger one gets 413 (default: 32 MiB)",
    )
    max_inputs_per_request: int = setting(
        2048, ge=1, group=LIMITS, help="inputs one request may carry (OpenAI's limit is 2048)"
    )
    max_chars_per_input: int = setting(
        1_000_000,
        ge=1,
        group=LIMITS,
        metavar="CHARS",
        help="characters one input may have (a text, both texts of a pair, a chat's contents); "
        "more is a 400 before any tokenizing",
    )
    max_documents_per_rerank: int | None = setting(
        ge=1,
        group=LIMITS,
        metavar="N",
        help="documents one /rerank request may carry (default: --max-inputs-per-request)",
    )
    request_timeout: float = setting(
        600.0, gt=0, help="seconds before an unfinished request gets 504 and is cancelled in the worker"
    )
    max_in_flight_per_worker: int | None = setting(
        ge=1, help="calls in flight per worker before new ones get 429 (default: no cap)"
    )
    max_queued_seconds: float = setting(
        5.0,
        ge=0,
        metavar="SECONDS",
        help="admit work up to this many seconds of a pool's measured capacity (its workers' tokens/s); "
        "more gets 429 with a Retry-After of the time it takes to drain (0 = no limit)",
    )
    max_queued_tokens: int | None = setting(
        ge=1,
        metavar="TOKENS",
        help="admit work up to this many tokens per pool (counted by the model's tokenizer in the gateway) "
        "instead of --max-queued-seconds",
    )
    drain_timeout: float = setting(
        30.0, gt=0, help="on SIGTERM, seconds the requests in flight may take before the gateway stops anyway"
    )
    health_check_interval: float = setting(0.25, gt=0, help="seconds between health checks of every worker")
    health_check_timeout: float = setting(
        0.75,
        gt=0,
        help="a worker that does not answer a health check within this many seconds is taken out "
        "(its calls in flight are retried on another worker)",
    )
    metrics_port: int | None = setting(
        ge=0, le=65535, help="serve Prometheus /metrics on this port instead of the API port"
    )
    metrics: bool = setting(True, negative="--no-metrics", help="no Prometheus metrics (and no /metrics route)")
    allowed_origins: list[str] = setting(
        factory=list,
        metavar="ORIGINS",
        help="answer browsers' CORS preflights and add Access-Control-Allow-Origin for these origins "
        '(repeatable or a comma list, e.g. https://app.example.com; "*": any origin, never with '
        "credentials); default: no CORS headers at all",
    )
    grpc_port: int | None = setting(
        ge=0,
        le=65535,
        group=GRPC,
        help="serve gRPC on this port beside HTTP: TEI's tei.v1 services, the Open Inference Protocol's "
        "inference.GRPCInferenceService, grpc.health.v1 and server reflection (default: off)",
    )
    grpc_tls_cert: str | None = setting(
        metavar="PEM", path=True, group=GRPC, help="serve gRPC over TLS with this certificate chain"
    )
    grpc_tls_key: str | None = setting(metavar="PEM", path=True, group=GRPC, help="... and this private key")
    grpc_stream_inflight: int = setting(
        256,
        ge=1,
        group=GRPC,
        metavar="N",
        help="inputs one gRPC stream may have in flight; the server reads no more of the stream until "
        "some are answered (HTTP/2 flow control then holds the client back)",
    )
    batch_dir: str | None = setting(
        metavar="DIR",
        path=True,
        group=BATCH,
        help="turn the Batch API on: jobs and files are kept in DIR (DIR/batches.sqlite3 and DIR/files/), run "
        "in the background by this gateway and resumed after a restart; without it its routes answer 404",
    )
    batch_max_file_mb: int = setting(
        512, ge=1, group=BATCH, metavar="MB", help="largest file one upload may be (OpenAI's 512 MB); more is a 413"
    )
    batch_max_lines: int = setting(
        50_000,
        ge=1,
        group=BATCH,
        metavar="N",
        help="requests one batch's input file may hold (OpenAI's 50,000); more fails the batch",
    )
    batch_tenant_mb: int | None = setting(
        ge=1,
        group=BATCH,
        metavar="MB",
        help="storage each tenant's files may take together (uploads and batch outputs); an upload past it "
        "is a 413 (default: no cap)",
    )
    batch_max_inflight: int = setting(
        64,
        ge=1,
        group=BATCH,
        metavar="N",
        help="lines of one batch in flight at once (the rest wait their turn); 2 while the gateway has live "
        "requests in flight",
    )
