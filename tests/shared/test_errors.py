"""Every PoolgateError crosses the worker→gateway transport, and is copied per call, with all its fields."""
from __future__ import annotations

import asyncio
import inspect
import typing

import pytest

from poolgate.shared.wire.connection import read_frame
from poolgate.shared.domain.errors import ERRORS, InternalError, Overloaded, PoolgateError, from_wire
from poolgate.shared.wire.messages import decode_frame
from poolgate.workers.listener import error_frame


def with_subclasses(cls: type) -> list[type]:
    return [cls] + [sub for direct in cls.__subclasses__() for sub in with_subclasses(direct)]


def crossing_errors() -> list[type[PoolgateError]]:
    """Every PoolgateError class loaded now that a worker can raise: shared's and the workers' own (the
    gateway's, such as ``HTTPError`` wrapping aiohttp's exceptions, never cross: a worker never imports it)."""
    return [cls for cls in with_subclasses(PoolgateError)
            if cls.__module__.startswith(("poolgate.shared.", "poolgate.workers."))]


def sample_value(hint, name: str, i: int):
    """A value of the field's type, unlike any default and unlike the other fields' values."""
    kinds = [t for t in (typing.get_args(hint) or (hint,)) if t is not type(None)]
    kind = kinds[0]
    if kind is str:
        return f"{name} value"
    if kind is bool:
        return True
    if kind in (int, float):
        return kind(7.5 + i)
    pytest.fail(f"no sample value for a field of type {hint!r} ({name}): add one here")


def sample_error(cls: type[PoolgateError]) -> PoolgateError:
    """``cls`` with every field that crosses the wire set to a value unlike its default."""
    hints = typing.get_type_hints(cls.__init__)
    defaults = {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()}
    fields = {name: sample_value(hints[name], name, i) for i, name in enumerate(cls.wire_fields())}
    for name, value in fields.items():
        assert value != defaults[name], f"{cls.__name__}.{name}: the sample equals the default"
    return cls(f"{cls.__name__} said «no»", **fields)


async def through_the_wire(err: PoolgateError) -> PoolgateError:
    """``err`` as the worker frames it (``error_frame``) and the client reads and rebuilds it."""
    reader = asyncio.StreamReader()
    reader.feed_data(error_frame(3, err))
    reader.feed_eof()
    header, arrays = decode_frame(*await read_frame(reader))
    assert header["id"] == 3 and header["ok"] is False and arrays == []
    return from_wire(header["error"])


async def test_every_error_type_round_trips_with_all_its_fields():
    classes = crossing_errors()
    assert set(ERRORS.values()) <= set(classes) and Overloaded in classes
    for cls in classes:
        sent = sample_error(cls)
        got = await through_the_wire(sent)
        assert type(got) is cls, f"{cls.__name__} arrived as {type(got).__name__}"
        assert vars(got) == vars(sent), cls.__name__
        assert (str(got), got.status, got.type, got.code) == (str(sent), sent.status, sent.type, sent.code)
        copy = sent.copy()  # the engine fails each call of a batch with its own copy
        assert type(copy) is cls and copy is not sent and vars(copy) == vars(sent), cls.__name__


async def test_overloaded_keeps_its_retry_after_and_reason():
    got = await through_the_wire(Overloaded("queue full", retry_after_s=7, reason="queue_full"))
    assert isinstance(got, Overloaded)
    assert (got.retry_after_s, got.reason, got.param) == (7, "queue_full", None)


def test_a_field_from_another_version_is_dropped_and_a_missing_one_is_defaulted():
    newer = from_wire({"class": "Overloaded", "message": "busy", "retry_after_s": 2.5, "colour": "red"})
    assert type(newer) is Overloaded and vars(newer) == {"message": "busy", "param": None, "retry_after_s": 2.5,
                                                         "reason": "overloaded"}
    older = from_wire({"class": "Overloaded", "message": "busy", "param": None})
    assert older.retry_after_s is None and older.reason == "overloaded"


def test_an_unknown_class_is_an_internal_error():
    got = from_wire({"class": "SomethingNew", "message": "odd", "param": "x", "retry_after_s": 3})
    assert type(got) is InternalError and vars(got) == {"message": "odd", "param": "x"}
