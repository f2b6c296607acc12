"""Frozen configuration, parsed once at the edge (the CLI) and passed down."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from poolgate.shared.config.declare import declared
from poolgate.shared.config.model_settings import ModelSettings
from poolgate.shared.domain.media_limits import MediaLimits

OtlpProtocol = Literal[
    "http/protobuf", "grpc"
]  # OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL (shared.telemetry.trace_export.EXPORTERS)
OTLP_PROTOCOLS: tuple[OtlpProtocol, ...] = get_args(OtlpProtocol)


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry export, from --otlp-traces-endpoint and the standard OTEL_* variables (read at the edge)."""

    endpoint: str  # OTLP traces endpoint, e.g. http://collector:4318/v1/traces (http) or collector:4317 (grpc)
    protocol: OtlpProtocol = "http/protobuf"
    service_name: str = "poolgate"
    sampler: str = "parentbased_always_on"  # OTEL_TRACES_SAMPLER
    sampler_arg: float | None = None  # OTEL_TRACES_SAMPLER_ARG
    headers: tuple[tuple[str, str], ...] = ()  # OTEL_EXPORTER_OTLP_(TRACES_)HEADERS
    detailed: bool = False  # --collect-detailed-traces: child spans in the worker


@dataclass(frozen=True)
class TransportSecurity:
    """Gateway<->worker transport security (``shared.wire.transport_security``), one side's view.

    A worker requires ``token`` as the first frame of every connection and serves TLS
    when given ``tls_cert`` and ``tls_key``; a gateway sends ``token`` and, with ``tls``,
    dials TCP workers over TLS, trusting ``tls_ca`` (None: the system trust store) and
    checking the certificate against ``tls_server_name`` (None: the host it dialed).
    """

    token: str | None = field(default=None, repr=False)  # never logged
    tls_cert: str | None = None  # worker: PEM certificate chain
    tls_key: str | None = None  # worker: PEM private key
    tls: bool = False  # gateway: dial TCP workers over TLS
    tls_ca: str | None = None  # gateway: PEM CA bundle that signed the workers' certificates
    tls_server_name: str | None = None  # gateway: the name the workers' certificates carry
    insecure_no_token: bool = False  # worker: listen beyond loopback without a token (asked for explicitly)


WORKER_DRAIN_TIMEOUT_S = 30.0  # a worker's default drain on SIGTERM (``poolgate worker --drain-timeout``)


@dataclass(frozen=True, kw_only=True)
class WorkerConfig(ModelSettings):
    """Everything one worker process needs to load and serve one model: the model settings, resolved, and what
    the gateway decides for the process.

    Every setting of ``shared.config.model_settings.ModelSettings`` (their one declaration) is a field here by
    inheritance, as ``shared.config.model_flags.worker_config`` resolves it: ``model`` is the model's folder (or
    ``.gguf`` file), ``served_model_name`` the name clients use, and the alias settings ``pooling_type`` and
    ``normalize`` are folded into ``pooler_config`` (so None here). The fields below them are the process's,
    not the user's: no flag or file key sets them.
    """

    # resolved, so required (field() drops the None default these two inherit):
    model: str = field()  # the model's folder or .gguf file
    served_model_name: str = field()  # the name clients use (MODEL's default name when none was given)
    max_queued_tokens: int | None = None  # the worker's queue bound (429 past it); None: 128 token budgets
    tracing: TracingConfig | None = None  # set with --collect-detailed-traces: the worker's child spans
    security: TransportSecurity = field(default_factory=TransportSecurity)  # token / TLS of its listener
    device: str | None = (
        None  # its GPU as the host numbers it (shared.config.backends.place); None: the backend's default
    )
    cpu_affinity: tuple[int, ...] | None = None  # logical CPUs it is pinned to (several CPU workers); None: not pinned
    drain_timeout_s: float = WORKER_DRAIN_TIMEOUT_S  # on SIGTERM, how long its calls may take (worker --drain-timeout)

    def __post_init__(self) -> None:
        if self.pooling_type is not None or self.normalize is not None:
            raise ValueError(
                "pooling_type and normalize are folded into pooler_config before a WorkerConfig is made "
                "(shared.config.model_flags.worker_config)"
            )

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> WorkerConfig:
        """The WorkerConfig of ``to_wire``'s dict (after JSON): a setting read from a table (``pooler_config``)
        is made by its declared maker, as the flag and the file make it."""
        body = dict(body)
        for item in declared(ModelSettings):
            if item.about.table is not None and body.get(item.name) is not None:
                body[item.name] = item.about.table(body[item.name])
        if body.get("tracing") is not None:
            tracing = body["tracing"]
            body["tracing"] = TracingConfig(**{**tracing, "headers": tuple(map(tuple, tracing["headers"]))})
        body["security"] = TransportSecurity(**(body.get("security") or {}))
        if body.get("cpu_affinity") is not None:
            body["cpu_affinity"] = tuple(body["cpu_affinity"])
        return cls(**body)


@dataclass(frozen=True)
class PoolConfig:
    """One pool of one served model: local worker processes on one backend, plus remote workers.

    A model may have several pools (e.g. CUDA replicas, then a CPU overflow pool); the
    gateway tries them in config order (``gateway.pools.model_pools``).
    """

    model: str | None  # the served name; None: whatever the (remote) workers report (--worker-url)
    backend: str = "auto"
    workers: tuple[WorkerConfig, ...] = ()  # one local worker process each
    devices: tuple[str, ...] = ()  # the device of each local worker (same length as workers), or () for none
    remotes: tuple[str, ...] = ()  # worker URLs: tcp://host:port, unix:/path, dns+tcp://name:port
    max_in_flight_per_worker: int | None = None  # this pool's admission cap; None: the gateway's
    # its images and audio (--allowed-media-domains, ...): the gateway fetches and decodes them, so it holds them
    media: MediaLimits = field(default_factory=MediaLimits)


@dataclass(frozen=True)
class BatchConfig:
    """The Batch API (``gateway.jobs``): where its jobs and files live, and its limits."""

    dir: str  # DIR/batches.sqlite3 (jobs and files) and DIR/files/ (their bytes)
    max_file_bytes: int = 512 * 1024 * 1024  # one upload; OpenAI's 512 MB
    max_lines: int = 50_000  # requests in one batch's input file; OpenAI's
    tenant_bytes: int | None = None  # every file of one tenant together; None = no cap
    max_inflight: int = 64  # lines of one batch in flight at once


@dataclass(frozen=True)
class Tenant:
    """One API keys file tenant (``gateway.config.tenants``): its keys as sha256 hex digests, the default
    priority of its requests and its quotas (None = none)."""

    name: str
    key_sha256: tuple[str, ...]
    priority: int = 0
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True)
class GrpcConfig:
    """The gateway's gRPC server (``gateway.grpc``): its port, TLS and how much of one stream is in flight."""

    port: int
    tls_cert: str | None = None  # PEM certificate chain; with tls_key: TLS
    tls_key: str | None = None
    stream_inflight: int = 256  # inputs one stream may have in flight


@dataclass(frozen=True)
class LoraModule:
    """One ``--lora-modules`` adapter: its name (a request's ``model``), folder and base model (None: the only one)."""

    name: str
    path: str
    base_model_name: str | None = None


@dataclass(frozen=True)
class GatewayConfig:
    """The HTTP side: where to listen, auth, truncation policy, the workers."""

    host: str = "127.0.0.1"
    port: int = 8000
    reuse_port: bool = False  # SO_REUSEPORT: several gateway processes share the port (the kernel spreads connections)
    gateway_processes: int = 1  # --gateway-processes: this many on the port, one set of workers (gateway.scale_out)
    api_key: str | None = None
    tenants: tuple[Tenant, ...] = ()  # --api-keys-file: more keys, each a tenant with quotas (gateway.http.tenants)
    auto_truncate: bool = False
    transport: Literal["unix", "tcp"] = "unix"
    pools: tuple[PoolConfig, ...] = ()  # every served model's pools, in config order
    model_roots: tuple[str, ...] = ()  # folders the admin API may load models from; () = no loading
    lora_modules: tuple[LoraModule, ...] = ()  # --lora-modules: adapters loaded once the workers are up
    io_processor_plugin: str | None = None  # --io-processor-plugin: /pooling's plugin (gateway.dialects.io_processor)
    startup_timeout_s: float = 600.0
    max_request_bytes: int = 32 * 1024 * 1024
    max_inputs_per_request: int = 2048  # OpenAI's documented limit
    max_chars_per_input: int | None = 1_000_000  # --max-chars-per-input (gateway.pools.admission); None = off
    max_documents_per_rerank: int | None = None  # --max-documents-per-rerank; None: max_inputs_per_request
    request_timeout_s: float | None = 600.0  # becomes each call's deadline; None = no deadline
    max_in_flight_per_worker: int | None = None  # calls per worker before 429; None = no cap
    max_queued_s: float | None = 5.0  # admit up to this many seconds of a pool's measured capacity; None = off
    max_queued_tokens: int | None = None  # or up to this many counted tokens per pool (gateway.pools.admission)
    health_probe_interval_s: float = 0.25  # how often every worker gets a health check (gateway.pools.health)
    health_check_timeout_s: float = 0.75  # a worker that does not answer its check within this is down
    drain_timeout_s: float = 30.0  # on SIGTERM, how long calls in flight may take before the gateway stops
    tracing: TracingConfig | None = None  # None: no spans at all
    allowed_origins: tuple[str, ...] = ()  # --allowed-origins: CORS for these origins ("*": any); () = no CORS
    metrics: bool = True  # Prometheus metrics at /metrics
    metrics_port: int | None = None  # serve /metrics on this port instead of the API port
    worker_security: TransportSecurity = field(default_factory=TransportSecurity)  # token / TLS to remote workers
    grpc: GrpcConfig | None = None  # --grpc-port: the gRPC server (gateway.grpc); None = off
    batch: BatchConfig | None = None  # --batch-dir: the Batch API's store and limits; None = off

    @property
    def workers(self) -> tuple[WorkerConfig, ...]:
        """Every local worker of every pool."""
        return tuple(w for pool in self.pools for w in pool.workers)
