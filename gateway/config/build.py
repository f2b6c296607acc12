"""The one builder of a GatewayConfig: from parsed serve settings and model entries (CLI or TOML).

``poolgate serve MODEL --workers N`` is a one-entry config: ``serve`` turns its
flags into one ``ModelEntry`` and calls ``build_config`` exactly as
``config_file`` does for each ``[[models]]`` table of a ``--config`` file. Both
read the model settings as one ``ModelSettings`` (``shared.config.model_settings``,
the declaration the flags and the table keys both derive from), so a key
cannot mean two things.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from poolgate.gateway.config.lora_modules import lora_modules
from poolgate.gateway.config.tenants import load_tenants
from poolgate.gateway.pools.discovery import check_url
from poolgate.shared.config.backends import place, placed
from poolgate.shared.config.frozen import (
    BatchConfig,
    GatewayConfig,
    GrpcConfig,
    LoraModule,
    PoolConfig,
    TracingConfig,
)
from poolgate.shared.config.model_flags import media_limits, worker_config
from poolgate.shared.config.model_settings import ModelSettings
from poolgate.shared.config.security_flags import gateway_security_from_args
from poolgate.shared.config.tracing_flags import tracing_config_from_args, with_worker_tracing


class SettingError(ValueError):
    """A wrong setting, with the key path it comes from (e.g. ``("models", 2)``) for a config file to locate."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class ModelEntry:
    """One pool to serve: the model settings and its workers."""

    settings: ModelSettings
    replicas: int | None = None  # local worker processes; None: one per device, else 0 with remotes, else 1
    devices: tuple[str, ...] = ()  # one device per local worker; () = the backend's default
    remotes: tuple[str, ...] = ()  # worker URLs
    max_in_flight_per_worker: int | None = None  # None: the gateway's


def pool_config(entry: ModelEntry, tracing: TracingConfig | None = None) -> PoolConfig:
    """The PoolConfig of one entry; ValueError (FileNotFoundError for a missing folder) when it is wrong."""
    settings, replicas = entry.settings, entry.replicas
    for url in entry.remotes:
        check_url(url)
    per_device = settings.replicas_per_device
    if entry.devices and replicas is not None and replicas != len(entry.devices) * per_device:
        raise ValueError(
            f"replicas = {replicas} but {len(entry.devices)} devices are listed with {per_device} worker(s) "
            "per device: drop replicas or make them agree"
        )
    if replicas is None:
        replicas = len(entry.devices) * per_device if entry.devices else 0 if entry.remotes else per_device
    if replicas == 0 and not entry.remotes:
        raise ValueError("a model needs local replicas (replicas >= 1) or remote workers")
    if replicas == 0:
        name = settings.served_model_name or settings.model  # the folder is on the workers' hosts, not here
        return PoolConfig(
            model=name,
            backend=settings.backend,
            remotes=entry.remotes,
            max_in_flight_per_worker=entry.max_in_flight_per_worker,
            media=media_limits(settings),
        )
    worker = with_worker_tracing(worker_config(settings), tracing)
    placements = place(settings.backend, replicas, entry.devices, per_device=per_device)  # device / core set each
    return PoolConfig(
        model=worker.served_model_name,
        backend=settings.backend,
        workers=tuple(placed(worker, p) for p in placements),
        devices=tuple(p.device for p in placements if p.device is not None),
        remotes=entry.remotes,
        max_in_flight_per_worker=entry.max_in_flight_per_worker,
        media=media_limits(settings),
    )


def check_pools(pools: tuple[PoolConfig, ...]) -> None:
    """Refuse two pools of one model on one backend (they would be one pool)."""
    seen: set[tuple] = set()
    for i, pool in enumerate(pools):
        key = (pool.model, pool.backend)
        if pool.model is not None and key in seen:
            raise SettingError(
                ("models", i),
                f"model '{pool.model}' has two pools on backend '{pool.backend}': "
                "put their workers in one entry (replicas, devices, remote)",
            )
        seen.add(key)


API_KEY_ENV = "POOLGATE_API_KEY"  # the API key when neither --api-key nor --api-key-file is given


def tenants(settings: argparse.Namespace) -> tuple:
    """The tenants of ``api_keys_file`` (``gateway.config.tenants``), or none."""
    path = getattr(settings, "api_keys_file", None)
    if path is None:
        return ()
    try:
        return load_tenants(path)
    except ValueError as exc:
        raise SettingError(("api_keys_file",), str(exc)) from None


def api_key(settings: argparse.Namespace) -> str | None:
    """``api_key``, or the first line of ``api_key_file`` (not both)."""
    path = getattr(settings, "api_key_file", None)
    if path is None:
        return settings.api_key
    if settings.api_key is not None:
        raise SettingError(("api_key_file",), "give api_key or api_key_file, not both")
    try:
        key = Path(path).read_text().strip()
    except OSError as exc:
        raise SettingError(("api_key_file",), f"cannot read {path}: {exc.strerror or exc}") from None
    if not key:
        raise SettingError(("api_key_file",), f"api key file {path} is empty")
    return key


def plugin_name(settings: argparse.Namespace) -> str | None:
    """``--io-processor-plugin``, checked against the installed plugins (``gateway.dialects.io_processor``)."""
    name = getattr(settings, "io_processor_plugin", None)
    if name is not None:
        from poolgate.gateway.dialects.io_processor import load_plugin  # the route's own loader, imported late

        try:
            load_plugin(name)
        except ValueError as exc:
            raise SettingError(("io_processor_plugin",), str(exc)) from None
    return name


def allowed_origins(values: list[str]) -> tuple[str, ...]:
    """``--allowed-origins`` (each value one origin or a comma list) as origins; SettingError for one that is
    not ``*`` or ``scheme://host[:port]`` (what a browser sends in ``Origin``: no path, no trailing slash)."""
    origins = tuple(dict.fromkeys(o.strip() for v in values for o in v.split(",") if o.strip()))
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if origin != "*" and not (sep and scheme in ("http", "https") and rest and "/" not in rest):
            raise SettingError(("allowed_origins",), f"{origin!r} is not an origin (scheme://host[:port], or *)")
    return origins


def gateway_processes(settings: argparse.Namespace, pools: tuple[PoolConfig, ...]) -> int:
    """``gateway_processes``; SettingError where N processes cannot honour the rest of the config."""
    n = settings.gateway_processes
    why = None
    if n > 1 and sys.platform != "linux":
        why = "needs Linux (SO_REUSEPORT spreads one port's connections only there; a process dies with its parent)"
    elif n > 1 and settings.transport == "tcp" and any(pool.workers for pool in pools):
        why = "needs transport = unix for local workers (a restarted worker's TCP port changes; the others lose it)"
    elif n > 1 and getattr(settings, "lora_modules", None):
        why = "cannot go with lora_modules (each process would load the adapters on the same workers)"
    elif n > 1 and settings.model_root:
        why = "cannot go with model_roots (the admin API would load or unload a model in one process only)"
    if why is not None:
        raise SettingError(("gateway_processes",), f"gateway_processes = {n} {why}")
    return n


def _lora_modules(settings: argparse.Namespace) -> tuple[LoraModule, ...]:
    try:
        return lora_modules(list(getattr(settings, "lora_modules", None) or ()))
    except ValueError as exc:
        raise SettingError(("lora_modules",), str(exc)) from None


MB = 1024 * 1024


def batch_config(settings: argparse.Namespace) -> BatchConfig | None:
    """The Batch API's settings when ``batch_dir`` is given (``gateway.jobs``); None: the API is off."""
    folder = getattr(settings, "batch_dir", None)
    if folder is None:
        return None
    path = Path(folder).resolve()
    if path.exists() and not path.is_dir():
        raise SettingError(("batch_dir",), f"batch_dir {path} is not a folder")
    tenant_mb = settings.batch_tenant_mb
    return BatchConfig(
        dir=str(path),
        max_file_bytes=settings.batch_max_file_mb * MB,
        max_lines=settings.batch_max_lines,
        tenant_bytes=None if tenant_mb is None else tenant_mb * MB,
        max_inflight=settings.batch_max_inflight,
    )


def grpc_config(settings: argparse.Namespace) -> GrpcConfig | None:
    """The gRPC server's settings when ``grpc_port`` is given (``gateway.grpc``); None: no gRPC server. A
    certificate needs its key and the other way round; TLS settings without a port are an error, not ignored."""
    port = getattr(settings, "grpc_port", None)
    cert, key = getattr(settings, "grpc_tls_cert", None), getattr(settings, "grpc_tls_key", None)
    if (cert is None) != (key is None):
        raise SettingError(("grpc_tls_cert",), "grpc_tls_cert and grpc_tls_key go together")
    if port is None:
        if cert is not None:
            raise SettingError(("grpc_tls_cert",), "grpc_tls_cert and grpc_tls_key need grpc_port (no gRPC server)")
        return None
    for name, path in (("grpc_tls_cert", cert), ("grpc_tls_key", key)):
        if path is not None and not Path(path).is_file():
            raise SettingError((name,), f"{name} {path} is not a file")
    return GrpcConfig(port=port, tls_cert=cert, tls_key=key, stream_inflight=settings.grpc_stream_inflight)


def build_config(
    settings: argparse.Namespace,
    pools: tuple[PoolConfig, ...],
    tracing: TracingConfig | None,
    environ: Mapping[str, str],
) -> GatewayConfig:
    """The GatewayConfig of the serve ``settings`` (a Namespace of the serve flags' dests) and ``pools``."""
    check_pools(pools)
    try:
        security = gateway_security_from_args(settings, environ)
    except OSError as exc:
        raise SettingError(("worker_token_file",), f"cannot read {exc.filename}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SettingError((), str(exc)) from None
    roots = tuple(str(Path(root).resolve()) for root in settings.model_root or ())
    for root in roots:
        if not Path(root).is_dir():
            raise SettingError(("model_roots",), f"model root {root} is not a folder")
    return GatewayConfig(
        host=settings.host,
        port=settings.port,
        reuse_port=bool(settings.reuse_port),
        gateway_processes=gateway_processes(settings, pools),
        api_key=api_key(settings) or environ.get(API_KEY_ENV) or None,
        tenants=tenants(settings),
        auto_truncate=settings.auto_truncate,
        transport=settings.transport,
        pools=pools,
        model_roots=roots,
        lora_modules=_lora_modules(settings),
        io_processor_plugin=plugin_name(settings),
        startup_timeout_s=settings.startup_timeout,
        max_inputs_per_request=settings.max_inputs_per_request,
        max_request_bytes=settings.max_request_bytes,
        max_chars_per_input=settings.max_chars_per_input,
        max_documents_per_rerank=settings.max_documents_per_rerank,
        request_timeout_s=settings.request_timeout,
        max_in_flight_per_worker=settings.max_in_flight_per_worker,
        max_queued_s=settings.max_queued_seconds or None,
        max_queued_tokens=settings.max_queued_tokens,
        drain_timeout_s=settings.drain_timeout,
        health_probe_interval_s=settings.health_check_interval,
        health_check_timeout_s=settings.health_check_timeout,
        allowed_origins=allowed_origins(settings.allowed_origins),
        tracing=tracing,
        metrics=settings.metrics,
        metrics_port=settings.metrics_port,
        worker_security=security,
        grpc=grpc_config(settings),
        batch=batch_config(settings),
    )


def config_from_entries(
    settings: argparse.Namespace, entries: list[ModelEntry], environ: Mapping[str, str]
) -> GatewayConfig:
    """``build_config`` over entries whose errors need no location (the command line)."""
    tracing = tracing_config_from_args(settings, environ)
    return build_config(settings, tuple(pool_config(e, tracing) for e in entries), tracing, environ)
