"""Turn result arrays into response values: float lists, base64, or raw bytes in vLLM's embed_dtype / endianness.

Vectors go from numpy buffers to the response without a Python float per
element: float lists are written by orjson straight from the float32 array
(``to_float_list``; per-token outputs as the float64 they widen to, ``to_double_list``),
base64 and bytes are the array's raw codes (``dialects.dtypes``). As in vLLM,
bytes are swapped only when ``endianness`` is neither ``native`` nor the
host's order; the default (float32, native on a little-endian host) is what
the OpenAI SDK decodes.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Callable
from typing import Literal

import numpy as np
import orjson

from poolgate.gateway.dialects.dtypes import EMBED_DTYPES

FLOAT32_LE = np.dtype("<f4")
EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]
EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
Endianness = Literal["native", "big", "little"]


def as_float32(array: np.ndarray) -> np.ndarray:
    """A C-contiguous little-endian float32 copy or view of ``array``."""
    return np.ascontiguousarray(array, dtype=FLOAT32_LE)


def to_raw(array: np.ndarray, embed_dtype: str = "float32", endianness: str = "native") -> bytes:
    """The raw bytes of ``array`` (row-major) as ``embed_dtype`` codes in ``endianness`` order."""
    codes = np.ascontiguousarray(EMBED_DTYPES[embed_dtype](np.asarray(array, dtype=np.float32)))
    if endianness not in ("native", sys.byteorder) and codes.dtype.itemsize > 1:
        codes = codes.byteswap()
    return codes.tobytes()


def to_base64(array: np.ndarray, embed_dtype: str = "float32", endianness: str = "native") -> str:
    """Base64 of ``to_raw`` (by default the float32 bytes the OpenAI SDK decodes)."""
    return base64.b64encode(to_raw(array, embed_dtype, endianness)).decode("ascii")


def to_float_list(array: np.ndarray) -> np.ndarray:
    """A JSON-ready float vector: the float32 array itself, which ``dumps`` writes."""
    return as_float32(array)


def to_double_list(array: np.ndarray) -> np.ndarray:
    """A JSON-ready float array that ``dumps`` writes as the float64 each value widens to (the numbers a
    Python float list of it would give), still without a Python float per element."""
    return np.ascontiguousarray(array, dtype=np.float64)


# encoding_format -> (embed_dtype, endianness) -> the per-item encoder of a JSON response (``float`` ignores
# embed_dtype and endianness, as vLLM does).
ENCODERS: dict[str, Callable[[str, str], Callable[[np.ndarray], object]]] = {
    "float": lambda embed_dtype, endianness: to_float_list,
    "base64": lambda embed_dtype, endianness: lambda a: to_base64(a, embed_dtype, endianness),
}


def json_encoder(
    encoding_format: str, embed_dtype: str = "float32", endianness: str = "native"
) -> Callable[[np.ndarray], object]:
    """The per-item encoder of a JSON response in ``encoding_format``."""
    return ENCODERS[encoding_format](embed_dtype, endianness)


def bytes_items(arrays: list[np.ndarray], embed_dtype: str, endianness: str) -> tuple[bytes, list[dict]]:
    """The body of a ``bytes`` response (the items' raw bytes back to back) and each item's metadata."""
    chunks, items, start = [], [], 0
    for i, array in enumerate(arrays):
        raw = to_raw(array, embed_dtype, endianness)
        chunks.append(raw)
        items.append(
            {
                "index": i,
                "embed_dtype": embed_dtype,
                "endianness": endianness,
                "start": start,
                "end": start + len(raw),
                "shape": list(np.shape(array)),
            }
        )
        start += len(raw)
    return b"".join(chunks), items


def dumps(body: object) -> bytes:
    """Serialize a response body that may hold float32 arrays from ``to_float_list``."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
