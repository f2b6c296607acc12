"""Turn result arrays into response JSON: float lists or base64 of raw float32 bytes.

Vectors go from numpy buffers to the response without a Python float per
element: base64 encodes the array's little-endian bytes, and float lists are
written by orjson straight from the float32 array.
"""
from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np
import orjson

FLOAT32_LE = np.dtype("<f4")


def as_float32(array: np.ndarray) -> np.ndarray:
    """A C-contiguous little-endian float32 copy or view of ``array``."""
    return np.ascontiguousarray(array, dtype=FLOAT32_LE)


def to_base64(array: np.ndarray) -> str:
    """Base64 of the raw little-endian float32 bytes (what the OpenAI SDK decodes)."""
    return base64.b64encode(as_float32(array).data).decode("ascii")


def to_float_list(array: np.ndarray):
    """A JSON-ready float vector: the float32 array itself, which ``dumps`` writes."""
    return as_float32(array)


ENCODERS: dict[str, Callable[[np.ndarray], object]] = {
    "float": to_float_list,
    "base64": to_base64,
}


def dumps(body: dict) -> bytes:
    """Serialize a response body that may hold float32 arrays from ``to_float_list``."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
