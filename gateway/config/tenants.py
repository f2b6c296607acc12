"""The API keys file (``--api-keys-file``): tenants, their keys (or keys' sha256 digests) and quotas.

A TOML file of ``[[tenants]]`` tables::

    [[tenants]]
    name = "search"                 # the metrics' ``tenant`` label (never the key)
    keys = ["sk-live-1"]            # and/or
    key_sha256 = ["9f86d08188..."]  # hex sha256 of a key, so the file need not hold the key itself
    priority = 0                    # the default priority of its requests (a request's own field wins)
    requests_per_minute = 600       # quotas; absent = none
    tokens_per_minute = 2_000_000
    max_concurrent = 16             # requests in flight at once

Plain keys are hashed when read: the gateway holds only digests and compares
them in constant time (``gateway.http.tenants``). Every error names the file,
the line and the key, as the config file's do. Names and keys are unique.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from poolgate.gateway.config.toml_lines import key_lines, line_of
from poolgate.shared.config.frozen import Tenant

HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
Positive = Annotated[int, Field(ge=1)]


class TenantTable(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    keys: list[Annotated[str, Field(min_length=8)]] = []
    key_sha256: list[str] = []
    priority: int = 0
    requests_per_minute: Positive | None = None
    tokens_per_minute: Positive | None = None
    max_concurrent: Positive | None = None

    @field_validator("key_sha256")
    @classmethod
    def _digests(cls, value: list[str]) -> list[str]:
        for digest in value:
            if not HEX_DIGEST.fullmatch(digest.lower()):
                raise ValueError(f"must be 64 hex digits (a sha256), got {digest[:16]!r}...")
        return [d.lower() for d in value]


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    tenants: list[TenantTable] = Field(min_length=1)


class _Problem(ValueError):
    """A wrong value at a key path, for ``load_tenants`` to locate in the file."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path = path


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def load_tenants(path: str) -> tuple[Tenant, ...]:
    """The tenants of the keys file at ``path``; ValueError naming file, line and key."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the API keys file: {exc.strerror or exc}") from None
    try:
        return tenants_from_toml(text)
    except _Problem as exc:
        line = line_of(key_lines(text), exc.path)
        where = f"{path}:{line}" if line is not None else path
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path).lstrip(".")
        raise ValueError(f"{where}: {key}: {exc}" if key else f"{where}: {exc}") from None


def tenants_from_toml(text: str) -> tuple[Tenant, ...]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _Problem((), f"not valid TOML: {exc}") from None
    try:
        tables = KeysFile.model_validate(doc).tenants
    except ValidationError as exc:
        err = exc.errors()[0]
        raise _Problem(tuple(err["loc"]), err["msg"]) from None
    tenants: list[Tenant] = []
    names: set[str] = set()
    seen: set[str] = set()  # key digests
    for i, table in enumerate(tables):
        digests = tuple(dict.fromkeys([*map(digest, table.keys), *table.key_sha256]))
        if not digests:
            raise _Problem(("tenants", i), "a tenant needs at least one of keys or key_sha256")
        if table.name in names:
            raise _Problem(("tenants", i, "name"), f"tenant {table.name!r} is named twice")
        if seen & set(digests):
            raise _Problem(("tenants", i), "a key belongs to two tenants")
        names.add(table.name)
        seen |= set(digests)
        tenants.append(
            Tenant(
                table.name,
                digests,
                table.priority,
                table.requests_per_minute,
                table.tokens_per_minute,
                table.max_concurrent,
            )
        )
    return tuple(tenants)
