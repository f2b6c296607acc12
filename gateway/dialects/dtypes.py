"""float32 arrays to the storage dtypes of vLLM's ``embed_dtype`` (float32, float16, bfloat16, fp8_e4m3/e5m2), in numpy.

The gateway has no torch, so the two 8-bit formats and bfloat16 are written
here with the same rounding torch uses when vLLM converts a tensor: round to
nearest, ties to even. bfloat16 is the top 16 bits of the rounded float32;
fp8 values are looked up in a table of the format's 128 non-negative codes.
Out-of-range values follow torch: e4m3fn (no infinities) saturates at ±448,
e5m2 becomes ±inf from 61440 up. Each array comes back in host byte
order, as the raw codes (bfloat16 as uint16, fp8 as uint8, as vLLM sends them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fp8Format:
    exponent_bits: int
    mantissa_bits: int
    max_code: int  # the largest finite non-negative code
    overflow_at: float  # |x| from here on becomes overflow_code
    overflow_code: int
    nan_code: int = 0x7F

    def values(self) -> np.ndarray:
        """The value of each code 0..max_code, increasing."""
        codes = np.arange(self.max_code + 1)
        bias = 2 ** (self.exponent_bits - 1) - 1
        exp, man = codes >> self.mantissa_bits, codes & ((1 << self.mantissa_bits) - 1)
        frac = man / (1 << self.mantissa_bits)
        normal = (1 + frac) * np.exp2(exp.astype(np.float64) - bias)
        subnormal = frac * 2.0 ** (1 - bias)
        return np.where(exp == 0, subnormal, normal)


FP8_FORMATS = {
    "fp8_e4m3": Fp8Format(exponent_bits=4, mantissa_bits=3, max_code=0x7E, overflow_at=np.inf, overflow_code=0x7E),
    "fp8_e5m2": Fp8Format(exponent_bits=5, mantissa_bits=2, max_code=0x7B, overflow_at=61440.0, overflow_code=0x7C),
}
_TABLES = {name: fmt.values() for name, fmt in FP8_FORMATS.items()}


def to_fp8(array: np.ndarray, name: str) -> np.ndarray:
    """uint8 codes of ``array`` (float32) in the fp8 format ``name``."""
    fmt, table = FP8_FORMATS[name], _TABLES[name]
    x = np.asarray(array, dtype=np.float32)
    a = np.abs(x).astype(np.float64)
    hi = np.clip(np.searchsorted(table, a), 1, fmt.max_code)  # table[hi-1] <= a <= table[hi] in range
    lo = hi - 1
    d_lo, d_hi = a - table[lo], table[hi] - a
    tie_to_hi = (d_hi == d_lo) & (hi % 2 == 0)
    code = np.where((d_hi < d_lo) | tie_to_hi, hi, lo)
    code = np.where(a > table[fmt.max_code], fmt.max_code, code)
    code = np.where(a >= fmt.overflow_at, fmt.overflow_code, code)
    code = np.where(np.isnan(x), fmt.nan_code, code).astype(np.uint8)
    return code | (np.signbit(x).astype(np.uint8) << 7)


def to_bfloat16(array: np.ndarray) -> np.ndarray:
    """uint16 bits of ``array`` (float32) rounded to bfloat16, ties to even; NaN stays a quiet NaN."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = (bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    return np.where(np.isnan(array), np.uint16(0x7FC0) | (out & np.uint16(0x8000)), out).astype(np.uint16)


def _to_float16(array: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # beyond 65504 is inf, as torch casts it
        return np.asarray(array, dtype=np.float32).astype(np.float16)


# embed_dtype -> float32 array to its raw codes (host byte order).
EMBED_DTYPES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "float32": lambda a: np.asarray(a, dtype=np.float32),
    "float16": lambda a: _to_float16(a),
    "bfloat16": to_bfloat16,
    "fp8_e4m3": lambda a: to_fp8(a, "fp8_e4m3"),
    "fp8_e5m2": lambda a: to_fp8(a, "fp8_e5m2"),
}
