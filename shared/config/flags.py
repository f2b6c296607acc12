"""The argparse flags of a settings declaration (``shared.config.declare``): a flag per setting, its checks the file's.

``add_flags`` adds one flag per setting of a declaration, in order, to the
declaration's ``--help`` group (or the group a setting names): its type,
choices, default, bounds (checked as the config file checks them), metavar and
help all come from the declaration, so a setting is a flag with nothing else to
write. ``poolgate serve`` adds the flags of ``ModelSettings`` and
``GatewaySettings``, ``poolgate worker`` and the tools those of ``ModelSettings``.
"""

from __future__ import annotations

import argparse
import json
import operator
from collections.abc import Callable
from typing import Any, get_origin

from poolgate.shared.config.declare import Declared, Setting, declared


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


def port_number(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port (0-65535), got {text}")
    return value


def add_flags(parser: argparse.ArgumentParser, declaration: type, title: str | None = None) -> None:
    """One flag per setting of ``declaration``, in the group ``title`` (None: the parser's own options), or in
    the group its setting names."""
    groups: dict[str | None, Any] = {title: parser.add_argument_group(title) if title else parser}
    for item in declared(declaration):
        group = item.about.group or title
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        names, options = flag_of(item)
        groups[group].add_argument(*names, **options)


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
    if get_origin(item.kind) is list and about.several:  # --flag A B, repeatable: every value is added
        return (f"--{item.name.replace('_', '-')}",), {**options, "action": "extend", "nargs": "+"}
    if get_origin(item.kind) is list:  # repeatable: each flag adds a value
        return (f"--{item.name.replace('_', '-')}",), {**options, "action": "append"}
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
    return (f"--{item.name.replace('_', '-')}", *about.aliases), {**options, "dest": item.name}


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
