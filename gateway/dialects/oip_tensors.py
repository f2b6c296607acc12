"""The Open Inference Protocol's tensors (KServe v2, Triton): one codec for REST's JSON and binary data and gRPC's.

A ``Tensor`` is a named, typed, shaped array: ``data`` is a numpy array of
``shape`` (row-major) in the datatype's little-endian numpy type, or, for
``BYTES``, an object array of ``bytes``. Every protocol carries a tensor in one
of two forms, and both read into the same ``Tensor``:

- ``from_data``: a flat row-major list of values (REST's JSON ``data``, gRPC's
  typed ``contents``); ``BYTES`` elements are strings (UTF-8 encoded here) or
  bytes, ``BOOL`` elements booleans, integer types integers in range, float
  types numbers; nested lists are read row-major as well;
- ``from_raw``: raw bytes (REST's binary tensor data extension, gRPC's
  ``raw_input_contents``): little-endian row-major; ``BOOL`` one byte per
  element; ``BYTES`` each element a 4-byte little-endian length, then its bytes.

``to_data`` and ``to_raw`` are their inverses. Whatever does not fit (an
unknown datatype, ``BF16``, a shape that is not non-negative integers, an
element count or byte length that disagrees with the shape, a value of the
wrong type or out of range) is an ``InvalidRequest`` (400) naming the tensor.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest

# datatype -> its numpy type (little-endian); BYTES is an object array of bytes.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
REFUSED = {"BF16": "BF16 tensors are not supported: send FP32"}
LENGTH = struct.Struct("<I")  # a BYTES element's length prefix


@dataclass(frozen=True)
class Tensor:
    """One tensor: ``data`` has ``shape`` (BYTES: an object array of ``bytes``). ``parameters``: the tensor's
    own, as the request sent them (REST's per-input ``parameters``, gRPC's ``InferInputTensor.parameters``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


def dtype_of(name: str, datatype: str) -> np.dtype:
    """The numpy type of ``datatype``; 400 naming tensor ``name`` for BF16 and unknown types."""
    if datatype in REFUSED:
        raise InvalidRequest(f"tensor '{name}': {REFUSED[datatype]}", param=name)
    if datatype not in DATATYPES:
        raise InvalidRequest(
            f"tensor '{name}': unknown datatype {datatype!r}; one of {', '.join(DATATYPES)}", param=name
        )
    return DATATYPES[datatype]


def checked_shape(name: str, shape: Sequence[Any]) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints; 400 naming the tensor otherwise (-1 is metadata's, not data's)."""
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidRequest(f"tensor '{name}': shape must be non-negative integers, got {list(shape)!r}", param=name)
    return tuple(shape)


def _count(name: str, shape: tuple[int, ...], got: int) -> None:
    want = math.prod(shape)
    if got != want:
        raise InvalidRequest(
            f"tensor '{name}': shape {list(shape)} holds {want} elements but the data has {got}", param=name
        )


def _flat(values: Sequence[Any]) -> list[Any]:
    """Nested lists read row-major into one list."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, list | tuple):
            out.extend(_flat(v))
        else:
            out.append(v)
    return out


def _element_bytes(name: str, value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, bytes):
        return value
    raise InvalidRequest(f"tensor '{name}': BYTES elements are strings, got {type(value).__name__}", param=name)


def from_data(name: str, datatype: str, shape: Sequence[Any], values: Sequence[Any]) -> Tensor:
    """A tensor from its flat row-major ``values`` (module doc)."""
    dtype, dims = dtype_of(name, datatype), checked_shape(name, shape)
    flat = _flat(values)
    _count(name, dims, len(flat))
    if datatype == "BYTES":
        data = np.empty(len(flat), dtype=object)
        data[:] = [_element_bytes(name, v) for v in flat]
        return Tensor(name, datatype, dims, data.reshape(dims))
    return Tensor(name, datatype, dims, _numbers(name, datatype, dtype, flat).reshape(dims))


def _numbers(name: str, datatype: str, dtype: np.dtype, flat: list[Any]) -> np.ndarray:
    """``flat`` as ``dtype``, each value of the datatype's kind and, for integers, in range."""
    if datatype == "BOOL":
        kinds: tuple[type, ...] = (bool, np.bool_)
        wrong = [v for v in flat if not isinstance(v, kinds)]
    elif dtype.kind in "iu":
        wrong = [v for v in flat if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer)]
    else:
        wrong = [v for v in flat if isinstance(v, bool | np.bool_) or not isinstance(v, int | float | np.number)]
    if wrong:
        raise InvalidRequest(f"tensor '{name}': {wrong[0]!r} is not a {datatype} value", param=name)
    if dtype.kind in "iu" and flat:
        info = np.iinfo(dtype)
        low, high = min(flat), max(flat)
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise InvalidRequest(f"tensor '{name}': {bad} is out of range for {datatype}", param=name)
    with np.errstate(over="ignore"):
        array = np.array(flat, dtype=dtype)
    if dtype.kind == "f" and (too_big := np.isinf(array) & np.isfinite(np.array(flat, dtype=np.float64))).any():
        raise InvalidRequest(
            f"tensor '{name}': {flat[int(np.argmax(too_big))]} is out of range for {datatype}", param=name
        )
    return array


def from_raw(name: str, datatype: str, shape: Sequence[Any], raw: bytes | memoryview) -> Tensor:
    """A tensor from its raw little-endian bytes (module doc)."""
    dtype, dims = dtype_of(name, datatype), checked_shape(name, shape)
    if datatype == "BYTES":
        return Tensor(name, datatype, dims, _split_bytes(name, dims, memoryview(raw)).reshape(dims))
    want = math.prod(dims) * dtype.itemsize
    if len(raw) != want:
        raise InvalidRequest(
            f"tensor '{name}': shape {list(dims)} of {datatype} takes {want} bytes but {len(raw)} were sent",
            param=name,
        )
    codes = np.frombuffer(raw, dtype=np.uint8 if datatype == "BOOL" else dtype)
    data = codes != 0 if datatype == "BOOL" else codes.copy()
    return Tensor(name, datatype, dims, data.reshape(dims))


def _split_bytes(name: str, dims: tuple[int, ...], raw: memoryview) -> np.ndarray:
    """The elements of a serialized BYTES tensor: each a 4-byte little-endian length, then that many bytes."""
    items: list[bytes] = []
    at, want = 0, math.prod(dims)
    while at < len(raw) and len(items) < want:
        if at + LENGTH.size > len(raw):
            break
        (n,) = LENGTH.unpack_from(raw, at)
        if at + LENGTH.size + n > len(raw):
            raise InvalidRequest(
                f"tensor '{name}': element {len(items)} says {n} bytes but the data ends first", param=name
            )
        items.append(bytes(raw[at + LENGTH.size : at + LENGTH.size + n]))
        at += LENGTH.size + n
    if len(items) != want or at != len(raw):
        raise InvalidRequest(
            f"tensor '{name}': shape {list(dims)} holds {want} BYTES elements but the data "
            + (f"has {len(raw) - at} bytes after them" if len(items) == want else f"has {len(items)}"),
            param=name,
        )
    data = np.empty(want, dtype=object)
    data[:] = items
    return data


def to_data(tensor: Tensor) -> list[Any]:
    """The flat row-major values of ``tensor``: Python numbers or booleans, BYTES as strings (400 for one that
    is not UTF-8: such a tensor goes raw)."""
    flat = np.ravel(tensor.data)
    if tensor.datatype != "BYTES":
        return flat.tolist()
    try:
        return [bytes(v).decode("utf-8") for v in flat]
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"tensor '{tensor.name}' is not UTF-8 text: ask for it as binary data", param=tensor.name
        ) from None


def to_raw(tensor: Tensor) -> bytes:
    """The raw little-endian row-major bytes of ``tensor`` (BYTES: length-prefixed elements)."""
    if tensor.datatype == "BYTES":
        return b"".join(LENGTH.pack(len(v)) + bytes(v) for v in np.ravel(tensor.data))
    dtype = np.dtype(np.uint8) if tensor.datatype == "BOOL" else dtype_of(tensor.name, tensor.datatype)
    return np.ascontiguousarray(tensor.data, dtype=dtype).tobytes()


def tensor(name: str, datatype: str, data: np.ndarray | Sequence[Any]) -> Tensor:
    """A tensor of ``data`` as it is shaped (an output being built): numbers cast to the datatype's type,
    BYTES elements (str or bytes) as bytes."""
    if datatype == "BYTES":
        values = np.asarray(data, dtype=object)
        flat = np.empty(values.size, dtype=object)
        flat[:] = [_element_bytes(name, v) for v in values.ravel()]
        return Tensor(name, datatype, tuple(values.shape), flat.reshape(values.shape))
    array = np.ascontiguousarray(data, dtype=dtype_of(name, datatype))
    return Tensor(name, datatype, tuple(array.shape), array)
