"""Turn result arrays into response JSON: float lists or base64 of raw float32 bytes.

Vectors go from numpy buffers to the response without a Python float per
element where we can: base64 encodes the array's little-endian bytes, and
float lists go through orjson's numpy support when orjson is installed
(json.dumps on ``tolist()`` otherwise; both give the same float32 values).
"""
from __future__ import annotations

import base64
import json
from collections.abc import Callable

import numpy as np

try:
    import orjson
except ImportError:  # orjson is optional: a faster path, not a dependency
    orjson = None

FLOAT32_LE = np.dtype("<f4")


def as_float32(array: np.ndarray) -> np.ndarray:
    """A C-contiguous little-endian float32 copy or view of ``array``."""
    return np.ascontiguousarray(array, dtype=FLOAT32_LE)


def to_base64(array: np.ndarray) -> str:
    """Base64 of the raw little-endian float32 bytes (what the OpenAI SDK decodes)."""
    return base64.b64encode(as_float32(array).data).decode("ascii")


def to_float_list(array: np.ndarray):
    """A JSON-ready float vector: the array itself for orjson, a list for json."""
    array = as_float32(array)
    return array if orjson is not None else array.tolist()


ENCODERS: dict[str, Callable[[np.ndarray], object]] = {
    "float": to_float_list,
    "base64": to_base64,
}


def dumps(body: dict) -> bytes:
    """Serialize a response body that may hold float32 arrays from ``to_float_list``."""
    if orjson is not None:
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return json.dumps(body, separators=(",", ":")).encode()
