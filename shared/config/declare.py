"""How a setting is declared once: a dataclass field whose type, default and ``setting(...)`` are its flag and file key.

A declaration (``shared.config.model_settings.ModelSettings``, ``gateway.config.settings.GatewaySettings``)
is a frozen dataclass; each field is a setting: its annotation is the value's type (a
``Literal`` gives the choices, ``list[str]`` a repeatable flag), its default the
default, and ``setting(...)`` adds what the flag and the file need (help, metavar,
bounds, ...). ``declared`` reads a declaration back as ``Declared`` items, from
which ``shared.config.flags`` makes the argparse flags and ``gateway.config.file`` the
config file's keys, as vLLM derives its CLI from ``EngineArgs``.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints


@dataclass(frozen=True)
class Setting:
    """What a setting's flag and file key need beyond its type and default."""

    help: str | None = None
    metavar: str | None = None
    ge: float | None = None  # bounds, checked on the command line and in the file
    gt: float | None = None
    le: float | None = None
    upper: bool = False  # the value is upper-cased before it is checked (--pooling-type mean)
    table: Callable[[dict[str, Any]], Any] | None = None  # JSON flag, TOML table; this makes the value
    const: Any = None  # the value of the flag given bare (nargs="?"); None: the flag needs a value
    negative: str | None = None  # a bool that only a flag of this name sets, to False (--no-normalize)
    positional: bool = False  # MODEL: an argument, not a flag
    file_key: str | None = None  # the config file's key, when it is not the setting's name
    path: bool = False  # a path: in the config file, relative to the file
    group: str | None = None  # the title of the --help group its flag is listed in (None: the declaration's)
    models_key: str | None = None  # a serve flag that sets this key of every [[models]] table (no top-level key)
    aliases: tuple[str, ...] = ()  # more flag names (vLLM's, e.g. --api-server-count)
    several: bool = False  # a list setting whose flag takes one or more values each time (H [H ...]), as vLLM's


def setting(default: Any = None, *, factory: Callable[[], Any] | None = None, **about: Any) -> Any:
    """A setting's field: its default (or default ``factory``) and its ``Setting``."""
    meta = {"setting": Setting(**about)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Declared:
    """One setting as the flags and the file read it."""

    name: str
    kind: Any  # the value's type without None: int, float, str, bool, a Literal, PoolerConfig, ...
    optional: bool  # None is a value (the default: not set)
    default: Any
    factory: Callable[[], Any] | None
    about: Setting

    @property
    def choices(self) -> tuple[Any, ...] | None:
        return get_args(self.kind) if get_origin(self.kind) is Literal else None

    @property
    def file_key(self) -> str:
        return self.about.file_key or self.name

    def default_value(self) -> Any:
        return self.factory() if self.factory is not None else self.default


def declared(declaration: type) -> Iterator[Declared]:
    """The settings of ``declaration`` (a dataclass of ``setting`` fields), in order."""
    hints = get_type_hints(declaration)
    for f in fields(declaration):
        hint, optional = hints[f.name], False
        if get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint):
            rest = [a for a in get_args(hint) if a is not type(None)]
            hint, optional = (rest[0] if len(rest) == 1 else Union[tuple(rest)]), True  # noqa: UP007
        factory = None if f.default_factory is MISSING else f.default_factory
        yield Declared(
            f.name, hint, optional, None if f.default is MISSING else f.default, factory, f.metadata["setting"]
        )
