"""Which flags the command line gave: argparse actions that note their destination in ``args.given_flags``.

``poolgate serve --config FILE --port P`` lets a flag override the file's
value, so it must know that ``--port`` was given, even when P equals the
default. ``note_given(parser)`` (before the arguments are added) swaps the
parser's store, store_true, store_false and append actions for ones that also
add their dest to the set ``args.given_flags``; a positional counts as given
when it took a value.
"""
from __future__ import annotations

import argparse
from typing import Any

GIVEN = "given_flags"
ACTIONS = {None: argparse._StoreAction, "store": argparse._StoreAction, "store_true": argparse._StoreTrueAction,
           "store_false": argparse._StoreFalseAction, "append": argparse._AppendAction}


def _noting(base: type[argparse.Action]) -> type[argparse.Action]:
    def __call__(self: argparse.Action, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        base.__call__(self, parser, namespace, values, option_string)
        if option_string is not None or values is not self.default:
            given = set(getattr(namespace, GIVEN, ()))
            setattr(namespace, GIVEN, given | {self.dest})

    return type(f"Noting{base.__name__}", (base,), {"__call__": __call__})


def note_given(parser: argparse.ArgumentParser) -> None:
    """Make the arguments added to ``parser`` from now on note in ``args.given_flags`` that they were given."""
    for name, base in ACTIONS.items():
        parser.register("action", name, _noting(base))


def given_flags(args: argparse.Namespace) -> dict:
    """dest -> value of every flag the command line gave."""
    return {dest: getattr(args, dest) for dest in getattr(args, GIVEN, ())}
