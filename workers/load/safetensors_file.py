"""One safetensors file read by offsets: the header once, each tensor with one read when asked (no memory map).

The format is a little-endian u64 header length, a JSON header
``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": …}`` and
the tensors' bytes after it. Reading each tensor with ``readinto`` instead of
mapping the file keeps the file's pages out of the worker's resident set (a
memory map counts every page touched until it is closed, a second copy of
the weights at the load's peak). The header is checked against the file's
size before anything is read, so a truncated or corrupt file is refused by
name at open.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
MAX_HEADER = 100 * 1024 * 1024  # as the reference implementation allows


class SafetensorsFile:
    """``keys``, ``shape(name)`` and ``get_tensor(name)`` over one open file; ValueError for a bad header."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file = open(self.path, "rb")  # noqa: SIM115 (kept open for the load; closed with the handle)
        size = self.path.stat().st_size
        (length,) = struct.unpack("<Q", self._read_at(0, 8, size))
        if length > min(MAX_HEADER, size - 8):
            raise ValueError(f"header length {length} does not fit a file of {size} bytes")
        header = json.loads(self._read_at(8, length, size))
        header.pop("__metadata__", None)
        self._start = 8 + length
        self._entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        for name, entry in header.items():
            dtype, shape, (begin, end) = DTYPES[entry["dtype"]], tuple(entry["shape"]), entry["data_offsets"]
            numel = 1
            for d in shape:
                numel *= d
            if end - begin != numel * dtype.itemsize or self._start + end > size or begin < 0:
                raise ValueError(f"tensor {name}: offsets {begin}..{end} do not hold {entry['dtype']}{list(shape)} "
                                 f"in a file of {size} bytes")
            self._entries[name] = (dtype, shape, begin, end)

    def _read_at(self, offset: int, n: int, size: int | None = None) -> bytearray:
        if size is not None and offset + n > size:
            raise ValueError(f"the file ends at byte {size}, before {offset + n}")
        buf = bytearray(n)
        self._file.seek(offset)
        view, done = memoryview(buf), 0
        while done < n:
            got = self._file.readinto(view[done:])
            if not got:
                raise ValueError(f"the file ended after {offset + done} bytes")
            done += got
        return buf

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def get_tensor(self, name: str) -> torch.Tensor:
        dtype, shape, begin, end = self._entries[name]
        if end == begin:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._read_at(self._start + begin, end - begin), dtype=dtype).reshape(shape)

    def close(self) -> None:
        self._file.close()
