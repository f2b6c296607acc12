"""A ``multipart/form-data`` upload read part by part: its small text fields in memory, its file streamed to disk.

The file part goes to a temporary file in the store's folder in blocks
(each write off the event loop), its size checked as it is read: one byte
past ``limit`` ends the upload with 413 (``RequestTooLarge``, naming the
limit) and the temporary file is removed, as it is on any other failure (a
client that leaves mid-upload included). A field other than the file is at
most ``MAX_FIELD_BYTES``; a field the caller does not expect, given twice, or
not text is a 400 naming it.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from poolgate.shared.domain.errors import InvalidRequest, RequestTooLarge

BLOCK = 1 << 20  # bytes read from the socket and written to disk at a time
MAX_FIELD_BYTES = 4096
MAX_FILENAME_CHARS = 1024


@dataclass
class Upload:
    """What an upload held: its text fields, and its file's name, temporary path and size."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str = ""
    path: Path | None = None
    size: int = 0


async def receive(
    request: web.Request, file_field: str, fields: frozenset[str], temp: Path, limit: int, limit_says: str
) -> Upload:
    """The upload of ``request`` (module doc): the file part ``file_field`` written to ``temp`` (the caller
    moves or removes it), the text ``fields``; ``limit_says`` names the limit in the 413."""
    if request.content_type != "multipart/form-data":
        raise InvalidRequest("Unsupported Media Type: this route takes multipart/form-data (a file upload)")
    upload = Upload()
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader) or not part.name:
                raise InvalidRequest("every part of the form needs a name (Content-Disposition: form-data; name=...)")
            if part.name in upload.fields or (part.name == file_field and upload.path is not None):
                raise InvalidRequest(f"form field {part.name!r} is given twice", param=part.name)
            if part.name == file_field:
                upload.filename = _filename(part)
                upload.path = temp
                upload.size = await _stream(part, temp, limit, limit_says)
            elif part.name in fields:
                upload.fields[part.name] = await _text(part)
            else:
                known = ", ".join(sorted({file_field, *fields}))
                raise InvalidRequest(f"unknown form field {part.name!r}; the fields are {known}", param=part.name)
    except (ValueError, AssertionError, HttpProcessingError) as exc:  # aiohttp's refusals of a malformed body
        await asyncio.to_thread(temp.unlink, True)
        raise InvalidRequest(f"malformed multipart/form-data body: {exc}") from None
    except BaseException:
        await asyncio.shield(asyncio.to_thread(temp.unlink, True))
        raise
    if upload.path is None:
        raise InvalidRequest(f"the form has no {file_field!r} part (the file to upload)", param=file_field)
    return upload


def _filename(part: BodyPartReader) -> str:
    name = part.filename
    if not name:
        raise InvalidRequest(f"the {part.name!r} part must be a file (Content-Disposition with a filename)")
    if len(name) > MAX_FILENAME_CHARS:
        raise InvalidRequest(f"the file name is {len(name)} characters; at most {MAX_FILENAME_CHARS}")
    return name


async def _text(part: BodyPartReader) -> str:
    data = b""
    while chunk := await part.read_chunk(MAX_FIELD_BYTES):
        data += chunk
        if len(data) > MAX_FIELD_BYTES:
            raise InvalidRequest(f"form field {part.name!r} is over {MAX_FIELD_BYTES} bytes", param=part.name)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidRequest(f"form field {part.name!r} is not UTF-8 text", param=part.name) from None


async def _stream(part: BodyPartReader, temp: Path, limit: int, limit_says: str) -> int:
    """The part's bytes into ``temp``, ``BLOCK`` at a time; its size; 413 one byte past ``limit``."""
    out: IO[bytes] = await asyncio.to_thread(open, temp, "xb")
    size = 0
    try:
        while chunk := await part.read_chunk(BLOCK):
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(f"The file is over {limit_says}.", param="file")
            await asyncio.to_thread(out.write, chunk)
        await asyncio.to_thread(_sync, out)
    finally:
        await asyncio.shield(asyncio.to_thread(out.close))
    return size


def _sync(out: IO[bytes]) -> None:
    out.flush()
    os.fsync(out.fileno())
