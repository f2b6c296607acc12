"""Cohere's embedding types from float vectors: float, int8, uint8, binary, ubinary, base64.

How each is computed (Cohere does not publish its own scheme; these are
fixed, batch-independent rules, so a vector's codes never depend on what it
was sent with):

- ``int8``  = clip(round(127 · x), −128, 127); decode as q / 127.
- ``uint8`` = clip(round(127.5 · (x + 1)), 0, 255); decode as q / 127.5 − 1.
  Both map the range [−1, 1] of a unit-norm vector's components onto the
  full integer range with one scale for every vector, so integer dot products
  rank like float ones; components outside [−1, 1] are clipped.
- ``ubinary`` = the sign bits (bit = x ≥ 0, as vLLM), packed 8 per byte,
  most significant bit first (``np.packbits``); ``binary`` = the same bytes
  as int8 (ubinary − 128). The dimension must be a multiple of 8.
- ``base64`` = base64 of the little-endian float32 bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from poolgate.gateway.dialects.encoding import to_base64
from poolgate.shared.domain.errors import InvalidRequest

INT8_SCALE = 127.0
UINT8_SCALE = 127.5


def int8(v: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(np.asarray(v, np.float32) * INT8_SCALE), -128, 127).astype(np.int8)


def uint8(v: np.ndarray) -> np.ndarray:
    return np.clip(np.rint((np.asarray(v, np.float32) + 1.0) * UINT8_SCALE), 0, 255).astype(np.uint8)


def ubinary(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v)
    if v.shape[-1] % 8:
        raise InvalidRequest(
            f"binary and ubinary embeddings need a dimension that is a multiple of 8; this one has {v.shape[-1]}.",
            param="embedding_types",
        )
    return np.packbits(v >= 0, axis=-1)


def binary(v: np.ndarray) -> np.ndarray:
    return (ubinary(v).astype(np.int16) - 128).astype(np.int8)


# embedding type -> one vector to its JSON value (int arrays are written by orjson as lists).
EMBEDDING_TYPES: dict[str, Callable[[np.ndarray], object]] = {
    "float": lambda v: np.ascontiguousarray(v, dtype=np.float32),
    "int8": int8,
    "uint8": uint8,
    "binary": binary,
    "ubinary": ubinary,
    "base64": to_base64,
}
