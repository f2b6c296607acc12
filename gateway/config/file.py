"""``poolgate serve --config FILE``: the TOML file as a pydantic model, with the command line's flags over it.

The file's keys are the flags' destinations. Top-level keys are the serve
flags (``FileSettings``): a key per gateway setting, derived from their one
declaration (``gateway.config.settings.GatewaySettings``) with the flag's
type, choices and bounds (``host``, ``port``, ``api_key`` or ``api_key_file``,
``transport``, ``request_timeout``, ``max_in_flight_per_worker``,
``model_roots``, ...), and the tracing and worker security keys (declared
here beside their flags' own; a test keeps them equal). Each ``[[models]]`` table
(``ModelTable``) has a key per model setting, derived from their one
declaration (``shared.config.model_settings.ModelSettings``) with the flag's type,
choices and bounds (``model``, ``backend``, ``dtype``, ``max_batch_tokens``,
``runner``, ``convert``, ``pooler_config`` and ``hf_overrides`` as TOML
tables, ...), plus the pool's keys (``PoolKeys``):

- ``name``: the served name (the flag ``--served-model-name``);
- ``replicas``: local worker processes (default: one per device, else 0 when
  remote workers are listed, else 1); ``devices``: one worker per device;
- ``max_in_flight_per_worker``: this pool's admission cap;
- ``[[models.remote]]`` tables with ``url`` (``tcp://host:port``, ``unix:/path``,
  or ``dns+tcp://service:port``, re-resolved, see ``gateway.pools.discovery``).

Several ``[[models]]`` tables with one ``name`` are one model's pools, one per
backend, tried in file order (``gateway.pools.model_pools``). Relative paths
(``model``, ``model_roots``, ``api_key_file``, ``worker_token_file``,
``worker_tls_ca``) are relative to the file. Defaults are the flags' own.

Flags over the file: a flag given on the command line replaces the file's
value, as with vLLM's ``--config`` (the file in a Kubernetes ConfigMap, host
and port from the pod spec): a serve flag its top-level key (``--port`` over
``port``), a model flag that key of every ``[[models]]`` table, ``--workers``
their ``replicas`` and ``--worker-url`` their remote workers.

Every error names the file, the line and the key, e.g.
``serve.toml:7: models[1].replicas: must be >= 0, got -1`` (lines from
``config.toml_lines``, since tomllib gives no positions).
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
)

from poolgate.gateway.config.build import ModelEntry, SettingError, build_config, pool_config
from poolgate.gateway.config.settings import GatewaySettings
from poolgate.gateway.config.toml_lines import Path_, key_lines, line_of
from poolgate.gateway.pools.discovery import check_url
from poolgate.shared.config.declare import Declared, declared
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.config.model_flags import add_model_arguments
from poolgate.shared.config.model_settings import ModelSettings
from poolgate.shared.config.tracing_flags import tracing_config_from_args

Positive = Annotated[int, Field(ge=1)]
DECLARED = (*declared(GatewaySettings), *declared(ModelSettings))
ALIASES = {item.file_key: item.name for item in DECLARED}  # file key -> flag dest
PATH_KEYS = frozenset({*(item.file_key for item in DECLARED if item.about.path), "worker_token_file", "worker_tls_ca"})
MODEL_FLAGS_OF_SERVE = {item.name: item.about.models_key for item in DECLARED if item.about.models_key}  # every table
NEGATIVE = frozenset(item.file_key for item in declared(ModelSettings) if item.about.negative)  # only false counts
EITHER = {"api_key": "api_key_file", "api_key_file": "api_key"}  # a flag for one replaces the file's other


class Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RemoteTable(Table):
    url: str

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_url(url)


class PoolKeys(Table):
    """The keys of a ``[[models]]`` table that are not model settings: the pool's workers."""

    replicas: Annotated[int, Field(ge=0)] | None = None
    devices: list = []
    remote: list[RemoteTable] = []
    max_in_flight_per_worker: Positive | None = None

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list) -> list:
        if not all(isinstance(d, (int, str)) and not isinstance(d, bool) for d in value):
            raise ValueError(f"must be a list of device indices or names, got {value!r}")
        if len(set(map(str, value))) != len(value):
            raise ValueError(f"lists a device twice: {value!r}")
        return value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


def file_field(item: Declared) -> tuple[Any, Any]:
    """The pydantic annotation and default of one setting's ``[[models]]`` key (the flag's checks, on TOML)."""
    about, kind = item.about, item.kind
    if about.table is not None:
        kind = Annotated[dict, AfterValidator(about.table)]  # the value, e.g. a PoolerConfig, made from the table
    if (about.ge, about.gt, about.le) != (None, None, None):
        kind = Annotated[kind, Field(ge=about.ge, gt=about.gt, le=about.le)]
    if about.upper:
        kind = Annotated[kind, BeforeValidator(_upper)]
    if item.optional:
        kind = kind | None
    return kind, Field(default_factory=item.factory) if item.factory is not None else item.default


def model_table(declaration: type = ModelSettings) -> type[PoolKeys]:
    """The pydantic model of a ``[[models]]`` table: a key per setting of ``declaration``, plus ``PoolKeys``."""
    keys: dict[str, Any] = {item.file_key: file_field(item) for item in declared(declaration)}
    doc = "One ``[[models]]`` table, or an admin API load body: the model settings plus the pool's workers."
    return create_model("ModelTable", __base__=PoolKeys, __doc__=doc, **keys)


if TYPE_CHECKING:
    ModelTable = PoolKeys
else:
    ModelTable = model_table()
ENTRY_KEYS = frozenset(PoolKeys.model_fields)  # not model settings


def top_keys(declaration: type = GatewaySettings) -> type[Table]:
    """The pydantic model of the file's top-level keys of ``declaration``: a key per setting, with its flag's
    checks (absent: the flag's default), but for the serve flags that set a ``[[models]]`` key."""
    keys: dict[str, Any] = {
        item.file_key: (file_field(item)[0] | None, None)
        for item in declared(declaration)
        if item.about.models_key is None
    }
    return create_model("GatewayKeys", __base__=Table, **keys)


if TYPE_CHECKING:
    GatewayKeys = Table
else:
    GatewayKeys = top_keys()


class FileSettings(GatewayKeys):
    """The whole file: the gateway settings' keys (``gateway.config.settings``), the tracing and worker
    security keys (their flags: ``shared.config.tracing_flags``, ``shared.config.security_flags``) and the
    ``[[models]]`` tables."""

    otlp_traces_endpoint: str | None = None
    collect_detailed_traces: bool | None = None
    worker_token_file: str | None = None
    worker_tls: bool | None = None
    worker_tls_ca: str | None = None
    worker_tls_server_name: str | None = None
    models: list[ModelTable] = Field(default=None, validate_default=True)

    @field_validator("models", mode="before")
    @classmethod
    def _some_models(cls, value: Any) -> Any:
        if not isinstance(value, list) or not value:
            raise ValueError("at least one [[models]] table is needed")
        return value


class ConfigError(ValueError):
    """A config file problem, its message already naming the file, line and key."""


def dotted(path: Path_) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


# pydantic error type -> what it means for a TOML value
MESSAGES = {
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "float_type": "must be a number",
    "list_type": "must be a list",
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "literal_error": "must be one of {expected}",
}
ITEMS: dict[str, type[Table]] = {"models": ModelTable, "remote": RemoteTable}  # array of tables -> one element's model


def setting_error(exc: ValidationError, root: type[Table]) -> SettingError:
    """The first problem pydantic found (validating ``root``; an unknown key first, a typo being the likeliest
    cause), as a SettingError at its key path."""
    err = min(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    path = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        table = root
        for part in path[:-1]:
            table = ITEMS.get(part, table) if isinstance(part, str) else table  # (an int: a list index)
        return SettingError(path, f"unknown key (known: {', '.join(table.model_fields)})")
    if err["type"] == "missing":
        return SettingError(path, "is required")
    if err["type"] == "value_error":
        return SettingError(path, str(err["ctx"]["error"]))
    template = MESSAGES.get(err["type"])
    message = template.format(**err.get("ctx", {})) if template else err["msg"]
    return SettingError(path, f"{message}, got {err['input']!r}")


def _under(folder: Path | None, value: str) -> str:
    return value if folder is None else str(folder / os.path.expanduser(value))


def _dest_values(table: Table, folder: Path | None, skip: frozenset = frozenset()) -> dict:
    """The keys ``table`` sets, as flag dests with flag-shaped values (file-relative paths resolved)."""
    out = {}
    for key in table.model_fields_set - skip:
        value = getattr(table, key)
        if key in PATH_KEYS:
            value = [_under(folder, v) for v in value] if isinstance(value, list) else _under(folder, value)
        elif key in NEGATIVE:
            value = False if value is False else None  # the flag (--no-normalize), given or not
        out[ALIASES.get(key, key)] = value
    return out


def _model_defaults() -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    add_model_arguments(parser)
    return parser.parse_args([])


MODEL_DEFAULTS = vars(_model_defaults())


def entry_of(table: ModelTable, flags: Mapping[str, Any], folder: Path | None = None) -> ModelEntry:
    """The ModelEntry of a validated table, with the model flags of ``flags`` over it."""
    args = {**MODEL_DEFAULTS, **_dest_values(table, folder, ENTRY_KEYS)}
    args.update({dest: value for dest, value in flags.items() if dest in MODEL_DEFAULTS})
    remotes = tuple(flags["worker_url"]) if "worker_url" in flags else tuple(r.url for r in table.remote)
    return ModelEntry(
        settings=ModelSettings(**args),
        replicas=flags.get("workers", table.replicas),
        devices=tuple(map(str, table.devices)),
        remotes=remotes,
        max_in_flight_per_worker=table.max_in_flight_per_worker,
    )


def model_entry(body: Mapping) -> ModelEntry:
    """An admin API load body as a ModelEntry; SettingError naming the key."""
    try:
        return entry_of(ModelTable.model_validate(body), {})
    except ValidationError as exc:
        raise setting_error(exc, ModelTable) from None


def config_from_toml(
    text: str,
    file: str,
    serve_parser: argparse.ArgumentParser,
    environ: Mapping[str, str] = os.environ,
    flags: Mapping[str, Any] = {},
) -> GatewayConfig:
    """The GatewayConfig of a config file's ``text`` with ``flags`` (dest -> value, given on the command line)
    over it; ConfigError naming file, line and key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    try:
        return _config(doc, Path(file).resolve().parent, serve_parser, environ, flags)
    except SettingError as exc:
        line = line_of(key_lines(text), exc.path)
        where = f"{file}:{line}" if line is not None else file
        raise ConfigError(f"{where}: {dotted(exc.path)}: {exc}" if exc.path else f"{where}: {exc}") from None


def _config(
    doc: dict, folder: Path, serve_parser: argparse.ArgumentParser, environ: Mapping[str, str], flags: Mapping[str, Any]
) -> GatewayConfig:
    try:
        file = FileSettings.model_validate(doc)
    except ValidationError as exc:
        raise setting_error(exc, FileSettings) from None
    top = {
        dest: value for dest, value in flags.items() if dest not in MODEL_DEFAULTS and dest not in MODEL_FLAGS_OF_SERVE
    }
    replaced = frozenset({"models", *(EITHER[dest] for dest in top if dest in EITHER)})  # --api-key over api_key_file
    settings = argparse.Namespace(
        **{**vars(serve_parser.parse_args([])), **_dest_values(file, folder, replaced), **top}
    )
    try:
        tracing = tracing_config_from_args(settings, environ)
    except ValueError as exc:
        raise SettingError((), str(exc)) from None
    pools = []
    for i, table in enumerate(file.models):
        try:
            pools.append(pool_config(entry_of(table, flags, folder), tracing))
        except FileNotFoundError as exc:
            raise SettingError(("models", i, "model"), str(exc)) from None
        except ValueError as exc:
            raise SettingError(("models", i), str(exc)) from None
    return build_config(settings, tuple(pools), tracing, environ)


def load_config(
    file: str,
    serve_parser: argparse.ArgumentParser,
    environ: Mapping[str, str] = os.environ,
    flags: Mapping[str, Any] = {},
) -> GatewayConfig:
    try:
        text = Path(file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the config file: {exc.strerror or exc}") from None
    return config_from_toml(text, file, serve_parser, environ, flags)
