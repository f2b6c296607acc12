"""The messages that cross the gateway↔worker transport, and their framing.

A frame is ``!II`` (header length, payload length), a JSON header, then the
payload: the raw bytes of every array the header lists, back to back. Vectors
never travel as JSON float lists.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from poolgate.shared.domain.lanes import LIVE, Lane
from poolgate.shared.domain.late_chunks import LateChunkText
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.tasks import PoolingTask
from poolgate.shared.domain.windows import WindowedText, Windows
from poolgate.shared.wire.media import MediaInput
from poolgate.shared.wire.rows import Rows

PREFIX = struct.Struct("!II")
MAX_HEADER_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class TextPair:
    """A (query, document) pair that a cross-encoder reads as ONE sequence (its score template, or the
    tokenizer's pair template, whose second segment BERT marks with token type 1). ``max_text_tokens`` /
    ``max_pair_tokens`` (0 = off) cut each side to that many content tokens first (vLLM's
    ``max_tokens_per_query`` / ``max_tokens_per_doc``)."""

    text: str
    text_pair: str
    max_text_tokens: int = 0
    max_pair_tokens: int = 0
    instruction: str | None = None  # for a score template that takes one (Qwen3-Reranker's <Instruct>)


@dataclass(frozen=True)
class CappedText:
    """A text cut to its first ``max_tokens`` content tokens before the special tokens are added
    (a bi-encoder's query or document under ``max_tokens_per_query`` / ``max_tokens_per_doc``)."""

    text: str
    max_tokens: int


@dataclass(frozen=True)
class ChatInput:
    """One conversation (OpenAI-style ``{"role", "content"}`` messages, text only), which the gateway
    renders to text with the model's chat template (``shared.inputs.stage.render_chats``) and then tokenizes."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


ObjectInput = TextPair | CappedText | ChatInput | WindowedText | LateChunkText | MediaInput
Input = str | list[int] | ObjectInput


def only_texts(inputs: Sequence[Input]) -> list[str] | None:
    """``inputs`` as texts when every one is a text; None when one is not."""
    texts = [x for x in inputs if isinstance(x, str)]
    return texts if len(texts) == len(inputs) else None


@dataclass(frozen=True)
class PoolingCall:
    """One dialect-free request: what to pool, how, by when, in which lane. It never crosses the transport: the
    gateway (or the offline API) tokenizes it into a ``shared.wire.token_call.TokenCall`` first
    (``shared.inputs.front``)."""

    request_id: str
    model: str
    inputs: list[Input]
    params: PoolingParams = field(default_factory=PoolingParams)
    deadline: float | None = None  # unix time; None = no deadline
    priority: int = 0
    trace_context: dict[str, str] = field(default_factory=dict)
    lane: Lane = LIVE  # bulk: below every live call (shared.domain.lanes)


@dataclass
class PoolingResult:
    """A call's outputs as one block (``Rows``, in input order), each input's token count, and
    its timings in seconds (the gateway's ``tokenize_s``, the worker's ``queue_s``, ``inference_s``). A call with
    ``WindowedText`` inputs has one row per window and its ``windows`` (``shared.domain.windows``); its token
    counts are per input, every window counted. A multi-output call (``PoolingParams.outputs``) has one
    more result per further output in ``more`` (its rows and, for a sparse output, token strings)."""

    outputs: Rows
    prompt_tokens: list[int]
    timings: dict[str, float] = field(default_factory=dict)
    windows: Windows | None = None
    tokens: list[list[str | None]] | None = None  # a sparse call with return_tokens: each row's token string
    more: list[PoolingResult] = field(default_factory=list)  # a multi-output call's further outputs, in order

    @property
    def total_tokens(self) -> int:
        return sum(self.prompt_tokens)


@dataclass(frozen=True)
class ModelInfo:
    """What a worker serves, reported once it is ready."""

    served_model_name: str
    architecture: str
    tasks: tuple[PoolingTask, ...]
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
    device: str | None = None  # where it runs, e.g. "cuda:3" (the host's GPU 3) or "cpu" (workers.backends report)
    device_name: str = ""  # the hardware's name, e.g. the GPU or CPU model
    attention: str | None = None  # the packed-attention path, e.g. "varlen_flash" or "grouped_sdpa"
    device_memory: dict[str, int] | None = None  # bytes once loaded: allocated/reserved/total (host: total/peak_rss)
    prompts: dict[str, str] | None = None  # input type -> prompt (config_sentence_transformers.json; Cohere input_type)
    chat_template: bool = False  # the tokenizer has a chat template (chat inputs; Cohere's prompt is a system turn)
    input_roles: bool = False  # queries and documents encode apart (PyLate): calls say PoolingParams.query_inputs
    adapters: tuple[str, ...] | None = None  # the task adapters a call may name (PoolingParams.adapter); None = none
    kernels: dict[str, str] | None = None  # op -> the kernel it runs and why not a faster one (Backend.kernels)
    tokenizer_sha256: str | None = None  # its TokenizerFiles' hash (shared.inputs.tokenizer_files); None: a fake's
    max_tokens_per_request: int | None = None  # --max-tokens-per-request, counted where the call is tokenized
    max_loras: int = 0  # run-time LoRA adapter slots (--max-loras; workers.models.run_loras); 0 = adapters off
    # what its inputs may hold (shared.wire.media): text, image, audio; a dual encoder's towers take one each
    modalities: tuple[str, ...] = ("text",)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> ModelInfo:
        body = dict(body)
        body["tasks"] = tuple(body["tasks"])
        for key in ("matryoshka_dimensions", "labels", "adapters", "modalities"):
            if body.get(key) is not None:
                body[key] = tuple(body[key])
        return cls(**body)


def encode_frame(header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> bytes:
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


def decode_frame(head: bytes, payload: bytes) -> tuple[dict[str, Any], list[np.ndarray]]:
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
