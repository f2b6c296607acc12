"""Which flags a command line gave: its arguments parsed again by the same flags, every default None.

``poolgate serve --config FILE --port P`` lets a flag override the file's
value, so it must know that ``--port`` was given, even when P equals the
default. argparse keeps no such record, so ``given_flags`` parses the
arguments a second time with a parser that the same ``add_arguments`` builds
and whose defaults are all None (``set_defaults``): what is not None there,
the command line gave (no flag parses to None). ``parse_noting_given`` parses
as usual and keeps that record in ``args.given_flags``; ``gateway.cli`` does
the same for every command.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

GIVEN = "given_flags"
AddArguments = Callable[[argparse.ArgumentParser], None]


def given_flags(add_arguments: AddArguments, argv: Sequence[str], args: argparse.Namespace) -> dict[str, Any]:
    """dest -> value of every flag (and positional) that ``argv`` gives the parser ``add_arguments`` builds;
    ``args`` is ``argv`` as that parser parsed it (its dests, defaults included, are what to set to None)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    parser.set_defaults(**dict.fromkeys(vars(args), None))
    return {dest: value for dest, value in vars(parser.parse_args(argv)).items() if value is not None}


def parse_noting_given(add_arguments: AddArguments, argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed by the flags of ``add_arguments``, with ``given_flags`` (dest -> value) what it gave."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    setattr(args, GIVEN, given_flags(add_arguments, argv, args))
    return args


def given(args: argparse.Namespace) -> dict[str, Any]:
    """dest -> value of every flag the command line gave (none, for a Namespace not parsed by the two above)."""
    return dict(getattr(args, GIVEN, {}))
