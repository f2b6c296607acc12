"""``poolgate serve --config FILE``: a TOML file read with tomllib into the GatewayConfig the flags would give.

The file's keys are the command line's, spelled with underscores, and they are
checked by the very argparse actions that parse the flags (one table, no second
list of keys): top-level keys are the serve flags (``host``, ``port``,
``api_key`` or ``api_key_file``, ``transport``, ``request_timeout``,
``max_in_flight_per_worker``, ``model_roots``, ...), and each ``[[models]]``
table takes the model flags (``model``, ``backend``, ``dtype``,
``max_batch_tokens``, ``runner``, ``convert``, ``pooler_config`` and
``hf_overrides`` as TOML tables, ...) plus:

- ``name``: the served name (the flag ``--served-model-name``);
- ``replicas``: local worker processes (default: one per device, else 0 when
  remote workers are listed, else 1); ``devices``: one worker per device;
- ``max_in_flight_per_worker``: this pool's admission cap;
- ``[[models.remote]]`` tables with ``url`` (``tcp://host:port``, ``unix:/path``,
  or ``dns+tcp://service:port``, re-resolved, see ``gateway.pools.discovery``).

Several ``[[models]]`` tables with one ``name`` are one model's pools, one per
backend, tried in file order (``gateway.pools.model_pools``). Relative paths
(``model``, ``model_roots``, ``api_key_file``, ``worker_token_file``,
``worker_tls_ca``) are relative to the file. The worker transport keys are the
flags': ``worker_token_file`` (else ``$POOLGATE_WORKER_TOKEN``), ``worker_tls``,
``worker_tls_ca``, ``worker_tls_server_name``.

Every error names the file, the line and the key, e.g.
``serve.toml:7: models[1].replicas: must be >= 0, got -1`` (lines from
``gateway.config.toml_lines``, since tomllib gives no positions).
"""
from __future__ import annotations

import argparse
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from poolgate.gateway.config.build import ModelEntry, SettingError, build_config, pool_config
from poolgate.gateway.config.toml_lines import KeyLines, Path_
from poolgate.shared.config import GatewayConfig
from poolgate.shared.model_flags import add_model_arguments, port_number, positive_int
from poolgate.shared.tracing_flags import tracing_config_from_args

# Serve flags that have no top-level key: they are per model in a file, or command-line only.
NOT_TOP_LEVEL = frozenset({"help", "config", "workers", "worker_url", "log_level"})
TOP_ALIASES = {"model_roots": "model_root"}  # file key -> flag dest
MODEL_ALIASES = {"name": "served_model_name"}
PATH_KEYS = frozenset({"model", "model_root", "api_key_file", "worker_token_file", "worker_tls_ca"})  # file-relative
MODEL_EXTRAS = frozenset({"replicas", "devices", "remote", "max_in_flight_per_worker"})


class ConfigError(ValueError):
    """A config file problem, its message already naming the file, line and key."""


class Located:
    """Turns a problem at a key path into a ConfigError naming file, line and key."""

    def __init__(self, file: str, lines: KeyLines):
        self.file, self.lines = file, lines

    def error(self, path: Path_, message: str) -> ConfigError:
        line = self.lines.line(path)
        where = f"{self.file}:{line}" if line is not None else self.file
        return ConfigError(f"{where}: {dotted(path)}: {message}" if path else f"{where}: {message}")


def dotted(path: Path_) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


# converter of an argparse action -> the TOML value types it takes
TOML_TYPES: dict[object, tuple[type, ...]] = {positive_int: (int,), port_number: (int,), None: (str,), str: (str,),
                                             str.upper: (str,)}
TYPE_NAMES = {(int,): "an integer", (str,): "a string", (int, float): "a number", (dict,): "a table",
              (bool,): "true or false"}


def _toml_types(action: argparse.Action) -> tuple[type, ...]:
    if action.nargs == 0:
        return (bool,)
    if action.type in TOML_TYPES:
        return TOML_TYPES[action.type]
    name = getattr(action.type, "__name__", "")
    if name in ("_pooler_config", "_json_object"):
        return (dict,)
    if name == "positive_float" or action.type is float:
        return (int, float)
    return (str, int, float)  # a converter this table does not know: it parses the value's text


def action_value(action: argparse.Action, value):
    """``value`` (as TOML gave it) parsed by ``action`` as if it came from its flag; ValueError if wrong."""
    kinds = _toml_types(action)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ValueError(f"must be {TYPE_NAMES.get(kinds, 'a string or number')}, got {value!r}")
    if action.nargs == 0:  # store_true / store_false: the flag given, or not
        return action.const if value == action.const else action.default
    text = json.dumps(value) if isinstance(value, dict) else str(value)
    try:
        parsed = action.type(text) if action.type is not None else text
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise ValueError(str(exc) or f"invalid value {value!r}") from None
    if action.choices is not None and parsed not in action.choices:
        raise ValueError(f"must be one of {', '.join(map(str, action.choices))}, got {value!r}")
    return parsed


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions}


def apply_keys(table: Mapping, actions: Mapping[str, argparse.Action], aliases: Mapping[str, str],
               base: argparse.Namespace, path: Path_, where: Located, *, skip: frozenset = frozenset(),
               folder: Path | None = None) -> argparse.Namespace:
    """``base`` (the flags' defaults) with every key of ``table`` parsed by its flag's action."""
    ns = argparse.Namespace(**vars(base))
    for key, value in table.items():
        if key in skip:
            continue
        dest = aliases.get(key, key)
        action = actions.get(dest)
        if action is None or key in aliases.values():
            known = sorted({*(k for k in actions if k not in aliases.values()), *aliases, *skip})
            raise where.error(path + (key,), f"unknown key (known: {', '.join(known)})")
        try:
            if action.nargs == "*" or isinstance(action, argparse._AppendAction):
                if not isinstance(value, list):
                    raise ValueError(f"must be a list, got {value!r}")
                parsed = [action_value(_single(action), v) for v in value]
                parsed = [_under(folder, v) for v in parsed] if dest in PATH_KEYS else parsed
            else:
                parsed = action_value(action, value)
                parsed = _under(folder, parsed) if dest in PATH_KEYS else parsed
        except ValueError as exc:
            raise where.error(path + (key,), str(exc)) from None
        setattr(ns, dest, parsed)
    return ns


def _single(action: argparse.Action) -> argparse.Action:
    """An append action seen as the store action of one element."""
    return argparse.Action(option_strings=action.option_strings, dest=action.dest, type=action.type,
                           choices=action.choices)


def _under(folder: Path | None, value):
    if folder is None or not isinstance(value, str):
        return value
    return str(folder / os.path.expanduser(value))


def model_entry(table: Mapping, path: Path_, where: Located, *, folder: Path | None = None) -> ModelEntry:
    """One ``[[models]]`` table (or an admin API body) as a ModelEntry."""
    if not isinstance(table, dict):
        raise where.error(path, "must be a table")
    parser = argparse.ArgumentParser(add_help=False)
    add_model_arguments(parser)
    args = apply_keys(table, _actions(parser), MODEL_ALIASES, parser.parse_args([]), path, where,
                      skip=MODEL_EXTRAS, folder=folder)
    return ModelEntry(args=args, replicas=_count(table, "replicas", path, where, minimum=0),
                      devices=_devices(table, path, where), remotes=_remotes(table, path, where),
                      max_in_flight_per_worker=_count(table, "max_in_flight_per_worker", path, where, minimum=1))


def _count(table: Mapping, key: str, path: Path_, where: Located, *, minimum: int) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise where.error(path + (key,), f"must be an integer, got {value!r}")
    if value < minimum:
        raise where.error(path + (key,), f"must be >= {minimum}, got {value}")
    return value


def _devices(table: Mapping, path: Path_, where: Located) -> tuple[str, ...]:
    value = table.get("devices", [])
    if not isinstance(value, list) or not all(isinstance(d, (int, str)) and not isinstance(d, bool)
                                              for d in value):
        raise where.error(path + ("devices",), f"must be a list of device indices or names, got {value!r}")
    devices = tuple(str(d) for d in value)
    if len(set(devices)) != len(devices):
        raise where.error(path + ("devices",), f"lists a device twice: {value!r}")
    return devices


def _remotes(table: Mapping, path: Path_, where: Located) -> tuple[str, ...]:
    from poolgate.gateway.pools.discovery import check_url

    value = table.get("remote", [])
    if not isinstance(value, list):
        raise where.error(path + ("remote",), "must be an array of tables: [[models.remote]] with url = ...")
    urls = []
    for i, remote in enumerate(value):
        at = path + ("remote", i)
        if not isinstance(remote, dict):
            raise where.error(at, "must be a table with url = ...")
        unknown = sorted(set(remote) - {"url"})
        if unknown:
            raise where.error(at + (unknown[0],), "unknown key (known: url)")
        if not isinstance(remote.get("url"), str):
            raise where.error(at + ("url",) if "url" in remote else at, "url is required (a string)")
        try:
            urls.append(check_url(remote["url"]))
        except ValueError as exc:
            raise where.error(at + ("url",), str(exc)) from None
    return tuple(urls)


def config_from_toml(text: str, file: str, serve_parser: argparse.ArgumentParser,
                     environ: Mapping[str, str] = os.environ) -> GatewayConfig:
    """The GatewayConfig a config file's ``text`` describes; ConfigError naming file, line and key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    where, folder = Located(file, KeyLines(text)), Path(file).resolve().parent
    model_parser = argparse.ArgumentParser(add_help=False)
    add_model_arguments(model_parser)
    skip = NOT_TOP_LEVEL | set(_actions(model_parser))
    top = {d: a for d, a in _actions(serve_parser).items() if d not in skip}
    settings = apply_keys(doc, top, TOP_ALIASES, serve_parser.parse_args([]), (), where, skip=frozenset({"models"}),
                          folder=folder)
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        raise where.error(("models",) if "models" in doc else (), "at least one [[models]] table is needed")
    try:
        tracing = tracing_config_from_args(settings, environ)
    except ValueError as exc:
        raise where.error((), str(exc)) from None
    pools = []
    for i, table in enumerate(models):
        entry = model_entry(table, ("models", i), where, folder=folder)
        try:
            pools.append(pool_config(entry, tracing))
        except FileNotFoundError as exc:
            raise where.error(("models", i, "model") if "model" in table else ("models", i), str(exc)) from None
        except ValueError as exc:
            raise where.error(("models", i), str(exc)) from None
    try:
        return build_config(settings, tuple(pools), tracing, environ)
    except SettingError as exc:
        raise where.error(exc.path, str(exc)) from None


def load_config(file: str, serve_parser: argparse.ArgumentParser,
                environ: Mapping[str, str] = os.environ) -> GatewayConfig:
    try:
        text = Path(file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the config file: {exc.strerror or exc}") from None
    return config_from_toml(text, file, serve_parser, environ)
