"""The messages that cross the gateway↔worker transport, and their framing.

A frame is ``!II`` (header length, payload length), a JSON header, then the
payload: the raw bytes of every array the header lists, back to back. Vectors
never travel as JSON float lists.
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field

import numpy as np

from poolgate.shared.params import PoolingParams
from poolgate.shared.rows import Rows

PREFIX = struct.Struct("!II")
MAX_HEADER_BYTES = 256 * 1024 * 1024

Input = str | list[int]


@dataclass(frozen=True)
class PoolingCall:
    """One dialect-free request: what to pool, how, and by when."""

    request_id: str
    model: str
    inputs: list[Input]
    params: PoolingParams = field(default_factory=PoolingParams)
    deadline: float | None = None  # unix time; None = no deadline
    priority: int = 0
    trace_context: dict[str, str] = field(default_factory=dict)

    def to_wire(self) -> dict:
        body = asdict(self)
        body["params"] = self.params.to_wire()
        return body

    @classmethod
    def from_wire(cls, body: dict) -> "PoolingCall":
        body = dict(body)
        body["params"] = PoolingParams.from_wire(body["params"])
        return cls(**body)


@dataclass
class PoolingResult:
    """A call's outputs as one block (``Rows``, in input order), each input's token count, and
    the worker's timings in seconds (``tokenize_s``, ``queue_s``, ``inference_s``)."""

    outputs: Rows
    prompt_tokens: list[int]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return sum(self.prompt_tokens)


@dataclass(frozen=True)
class ModelInfo:
    """What a worker serves, reported once it is ready."""

    served_model_name: str
    architecture: str
    tasks: tuple[str, ...]
    max_model_len: int
    embedding_dim: int
    backend: str
    dtype: str
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None
    vocab_size: int | None = None
    labels: tuple[str, ...] | None = None  # classify / token_classify: the label of each output, by index
    chunked_processing: bool = False  # embed inputs over max_model_len run in chunks (--pooler-config)
    max_embed_len: int | None = None  # with chunked_processing: the embed input cap; None = no cap

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, body: dict) -> "ModelInfo":
        body = dict(body)
        body["tasks"] = tuple(body["tasks"])
        for key in ("matryoshka_dimensions", "labels"):
            if body.get(key) is not None:
                body[key] = tuple(body[key])
        return cls(**body)


def encode_frame(header: dict, arrays: list[np.ndarray] = ()) -> bytes:
    """Header JSON plus the arrays' raw bytes, described in ``header["arrays"]``."""
    specs, chunks = [], []
    for arr in arrays:
        arr = np.ascontiguousarray(arr)
        specs.append({"dtype": arr.dtype.str, "shape": list(arr.shape)})
        chunks.append(arr.tobytes())
    if specs:
        header = {**header, "arrays": specs}
    head = json.dumps(header, separators=(",", ":")).encode()
    payload = b"".join(chunks)
    return PREFIX.pack(len(head), len(payload)) + head + payload


def decode_frame(head: bytes, payload: bytes) -> tuple[dict, list[np.ndarray]]:
    """Inverse of ``encode_frame``; arrays are read-only views of the payload."""
    header = json.loads(head)
    arrays, offset = [], 0
    for spec in header.pop("arrays", ()):
        dtype = np.dtype(spec["dtype"])
        count = int(np.prod(spec["shape"], dtype=np.int64))
        arr = np.frombuffer(payload, dtype=dtype, count=count, offset=offset)
        arrays.append(arr.reshape(spec["shape"]))
        offset += count * dtype.itemsize
    return header, arrays
