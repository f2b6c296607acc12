"""The model flags ``poolgate serve``, ``poolgate worker`` and the tools share, derived from one declaration.

Every flag is a setting of ``shared.model_settings.ModelSettings`` (name, type,
choices, default, bounds, help); ``add_model_arguments`` adds one flag per
setting, ``settings_from_args`` reads them back as a ModelSettings, and
``worker_config`` resolves that into the WorkerConfig (which extends
ModelSettings, so every setting is its field of the same name). The config
file's ``[[models]]`` table is derived from the same declaration
(``gateway.config.file``), so a flag, its file key and its WorkerConfig field
cannot drift.
"""

from __future__ import annotations

import argparse
import json
import operator
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from poolgate.shared.config import WorkerConfig
from poolgate.shared.model_settings import Declared, ModelSettings, Setting, declared
from poolgate.shared.models import resolve_model
from poolgate.shared.pooler_config import PoolerConfig


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (0-65535), got {text}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser, declaration: type = ModelSettings) -> None:
    """MODEL and the flags that say how a worker loads and serves it: one per setting of ``declaration``."""
    group = parser.add_argument_group("model")
    for item in declared(declaration):
        names, options = flag_of(item)
        group.add_argument(*names, **options)


def flag_of(item: Declared) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The names and ``add_argument`` options of one setting's flag."""
    about, default = item.about, item.default_value()
    options: dict[str, Any] = {"default": default, "help": about.help}
    if about.metavar is not None:
        options["metavar"] = about.metavar
    if about.positional:
        return (item.name,), {**options, "nargs": "?"}
    if about.negative is not None:
        return (about.negative,), {**options, "dest": item.name, "action": "store_false"}
    if item.kind is bool:
        return (f"--{item.name.replace('_', '-')}",), {**options, "action": "store_true"}
    if about.table is not None:
        options["type"] = _table(about.table)
    elif item.choices is not None:
        options["choices"] = item.choices
        if about.upper:
            options["type"] = str.upper
    elif item.kind in (int, float):
        options["type"] = _bounded(item.kind, about)
    if about.const is not None:
        options.update(nargs="?", const=about.const)
    return (f"--{item.name.replace('_', '-')}",), options


def _bounded(kind: type[int] | type[float], about: Setting) -> Callable[[str], Any]:
    """``kind`` parsed from text and held to the setting's bounds (the same the config file checks)."""
    bounds = [(about.ge, ">=", operator.ge), (about.gt, ">", operator.gt), (about.le, "<=", operator.le)]

    def parse(text: str) -> Any:
        value = kind(text)
        if not all(test(value, bound) for bound, _, test in bounds if bound is not None):
            said = " and ".join(f"{sign} {bound:g}" for bound, sign, _ in bounds if bound is not None)
            raise argparse.ArgumentTypeError(f"must be {said}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"
    return parse


def _table(make: Callable[[dict[str, Any]], Any]) -> Callable[[str], Any]:
    """A JSON object from the command line, made into the setting's value."""

    def parse(text: str) -> Any:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError("must be a JSON object")
        try:
            return make(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "JSON"
    return parse


def settings_from_args(args: argparse.Namespace) -> ModelSettings:
    """The ModelSettings of the model flags in ``args`` (each setting the dest of its name)."""
    return ModelSettings(**{item.name: getattr(args, item.name) for item in declared()})


def folded_pooler(settings: ModelSettings) -> PoolerConfig:
    """``pooler_config`` with its alias settings folded in; ValueError when both say the same thing."""
    pooler = settings.pooler_config
    changes: dict[str, Any] = {}
    if settings.pooling_type is not None:
        if pooler.pooling_type or pooler.seq_pooling_type:
            raise ValueError("--pooling-type and --pooler-config's pooling type are both given")
        changes["seq_pooling_type"] = settings.pooling_type
    if settings.normalize is not None:
        if pooler.use_activation is not None:
            raise ValueError("--no-normalize and --pooler-config's use_activation are both given")
        changes["use_activation"] = settings.normalize
    return replace(pooler, **changes) if changes else pooler


def worker_config(settings: ModelSettings) -> WorkerConfig:
    """The WorkerConfig of ``settings``: MODEL resolved to its folder (FileNotFoundError if it is missing) and
    its served name, the pooler aliases folded into ``pooler_config`` (ValueError when they clash)."""
    path, name = resolve_model(settings.model)
    resolved = {
        "model": path,
        "served_model_name": settings.served_model_name or name,
        "pooler_config": folded_pooler(settings),
        "pooling_type": None,
        "normalize": None,
    }
    return WorkerConfig(**{**{f.name: getattr(settings, f.name) for f in fields(settings)}, **resolved})


def worker_config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """The WorkerConfig the model flags describe; FileNotFoundError if the model folder is missing."""
    return worker_config(settings_from_args(args))
