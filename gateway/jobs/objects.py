"""OpenAI's File and Batch objects, their lists, and the bodies the Files and Batch routes take, as pydantic models.

The answers are built through these models from the store's rows
(``gateway.jobs.store``), so what ``/openapi.json`` documents is what is sent.
Every field OpenAI's SDK knows is there (``openai.types.FileObject``,
``Batch``, ``BatchUsage``, ``BatchRequestCounts``, ``BatchError``); ``usage``
counts the input tokens the lines' answers reported (a pooling model has no
output tokens).
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from poolgate.gateway.jobs.lines import URLS
from poolgate.gateway.jobs.store import Row, Status

MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 2_592_000  # OpenAI's bounds of expires_after.seconds: 1 hour to 30 days
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
COMPLETION_WINDOW = "24h"
WINDOW_S = 24 * 3600


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExpiresAfter(Strict):
    """When a file expires: ``seconds`` after its creation."""

    anchor: Literal["created_at"]
    seconds: Annotated[int, Field(ge=MIN_EXPIRY_S, le=MAX_EXPIRY_S)]


class FileUpload(BaseModel):
    """``POST /v1/files`` (multipart/form-data); only ``purpose=batch`` is taken here."""

    model_config = ConfigDict(populate_by_name=True)
    file: bytes = Field(description="The file: JSONL, one request a line")
    purpose: Literal["batch"]
    expires_anchor: Literal["created_at"] | None = Field(None, alias="expires_after[anchor]")
    expires_seconds: Annotated[int, Field(ge=MIN_EXPIRY_S, le=MAX_EXPIRY_S)] | None = Field(
        None, alias="expires_after[seconds]"
    )


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"  # deprecated by OpenAI; always processed here
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class FileListQuery(Strict):
    """``GET /v1/files``'s query: a cursor page of the caller's files."""

    after: str | None = None
    limit: Annotated[int, Field(ge=1, le=10_000)] = 10_000
    order: Literal["asc", "desc"] = "desc"
    purpose: str | None = None


class BatchCreate(Strict):
    """``POST /v1/batches``."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if value not in URLS:
            raise ValueError(f"{value!r} is not served here; a batch's endpoint is one of {', '.join(URLS)}")
        return value

    @field_validator("completion_window")
    @classmethod
    def _window(cls, value: str) -> str:
        if value != COMPLETION_WINDOW:
            raise ValueError(f"only {COMPLETION_WINDOW!r} is supported, got {value!r}")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} pairs, got {len(value)}")
        for key, item in value.items():
            if len(key) > MAX_METADATA_KEY:
                raise ValueError(f"keys are at most {MAX_METADATA_KEY} characters; {key[:20]!r}... has {len(key)}")
            if len(item) > MAX_METADATA_VALUE:
                raise ValueError(f"values are at most {MAX_METADATA_VALUE} characters; {key!r}'s has {len(item)}")
        return value


class BatchListQuery(Strict):
    """``GET /v1/batches``'s query: a cursor page of the caller's batches, newest first."""

    after: str | None = None
    limit: Annotated[int, Field(ge=1, le=100)] = 20


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchError(BaseModel):
    code: str | None = None
    line: int | None = None
    message: str | None = None
    param: str | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: Status
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None
    model: str | None = None
    usage: BatchUsage


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


def file_object(row: Row) -> FileObject:
    return FileObject(**{k: row[k] for k in ("id", "bytes", "created_at", "expires_at", "filename", "purpose")})


TIMES = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def batch_object(row: Row) -> BatchObject:
    errors = json.loads(row["errors"]) if row["errors"] else None
    return BatchObject(
        id=row["id"],
        endpoint=row["endpoint"],
        errors=BatchErrors(data=[BatchError(**e) for e in errors]) if errors else None,
        input_file_id=row["input_file_id"],
        completion_window=row["completion_window"],
        status=row["status"],
        output_file_id=row["output_file_id"],
        error_file_id=row["error_file_id"],
        request_counts=RequestCounts(total=row["total"], completed=row["completed"], failed=row["failed"]),
        metadata=json.loads(row["metadata"]) if row["metadata"] else None,
        model=row["model"],
        usage=BatchUsage(input_tokens=row["input_tokens"], total_tokens=row["input_tokens"]),
        **{name: row[name] for name in TIMES},
    )
