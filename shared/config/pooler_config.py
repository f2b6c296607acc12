"""``--pooler-config``: vLLM's PoolerConfig fields, parsed and checked once at the edge.

Every field of vLLM's ``PoolerConfig`` is accepted with its name and default.
``pooling_type`` is an alias that fills ``seq_pooling_type`` (CLS, LAST, MEAN)
or ``tok_pooling_type`` (ALL, STEP). The removed ``normalize`` and task names
fail with vLLM's messages, unknown keys name themselves, ``logit_sigma`` 0 is
refused, and ``step_tag_id`` / ``returned_token_ids`` need STEP pooling.
``enable_chunked_processing`` turns on vLLM's chunked processing of long embed
inputs (``workers.engine.chunking``); ``max_embed_len`` is then the embed input cap
(None: no cap) and means nothing without it, so it is refused alone. Nothing
is accepted and ignored. Precedence when the worker applies it: this config >
sentence-transformers files > the architecture's default.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from poolgate.shared.domain.tasks import POOLING_TASKS, REMOVED_TASKS

SEQ_TYPES = ("CLS", "LAST", "MEAN")
TOK_TYPES = ("ALL", "STEP")


# field -> the Python types its JSON value may have (None is always allowed)
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "task": (str,),
    "pooling_type": (str,),
    "seq_pooling_type": (str,),
    "tok_pooling_type": (str,),
    "use_activation": (bool,),
    "dimensions": (int,),
    "enable_chunked_processing": (bool,),
    "max_embed_len": (int,),
    "logit_mean": (int, float),
    "logit_sigma": (int, float),
    "step_tag_id": (int,),
    "returned_token_ids": (tuple,),
    "enable_flash_late_interaction": (bool,),
}
FIELD_TYPE_NAMES = {
    name: {
        (str,): "a string",
        (bool,): "true or false",
        (int,): "an integer",
        (int, float): "a number",
        (tuple,): "a list of token ids",
    }[kinds]
    for name, kinds in FIELD_TYPES.items()
}


@dataclass(frozen=True)
class PoolerConfig:
    task: str | None = None
    pooling_type: str | None = None
    seq_pooling_type: str | None = None
    tok_pooling_type: str | None = None
    use_activation: bool | None = None
    dimensions: int | None = None
    enable_chunked_processing: bool = False
    max_embed_len: int | None = None
    logit_mean: float | None = None
    logit_sigma: float | None = None
    step_tag_id: int | None = None
    returned_token_ids: tuple[int, ...] | None = None
    enable_flash_late_interaction: bool = True

    def __post_init__(self) -> None:
        self._check_types()
        if self.task in REMOVED_TASKS:
            raise ValueError(REMOVED_TASKS[self.task])
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"pooler config task {self.task!r} is not one of {list(POOLING_TASKS)}")
        if self.pooling_type is not None and (self.seq_pooling_type or self.tok_pooling_type):
            raise ValueError("pooling_type cannot be combined with seq_pooling_type or tok_pooling_type")
        for name, allowed in (
            ("seq_pooling_type", SEQ_TYPES),
            ("tok_pooling_type", TOK_TYPES),
            ("pooling_type", SEQ_TYPES + TOK_TYPES),
        ):
            value = getattr(self, name)
            if value is not None and value.upper() not in allowed:
                raise ValueError(f"pooler config {name} {value!r} is not one of {list(allowed)}")
        if self.logit_sigma == 0:
            raise ValueError("pooler config logit_sigma must not be 0")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError("pooler config dimensions must be a positive integer")
        self._check_chunking()
        if (self.step_tag_id is not None or self.returned_token_ids) and self.token_pooling != "STEP":
            raise ValueError("step_tag_id and returned_token_ids need STEP pooling (tok_pooling_type STEP)")

    def _check_types(self) -> None:
        """Each field's JSON type, so a wrong one is a clear error at start-up, never a traceback."""
        for f in fields(self):
            value, kinds = getattr(self, f.name), FIELD_TYPES[f.name]
            ok = value is None or (isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds))
            if not ok:
                raise ValueError(f"pooler config {f.name} must be {FIELD_TYPE_NAMES[f.name]}, got {value!r}")
        if self.returned_token_ids is not None and not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.returned_token_ids
        ):
            raise ValueError("pooler config returned_token_ids must be a list of token ids")

    def _check_chunking(self) -> None:
        if not isinstance(self.enable_chunked_processing, bool):
            raise ValueError("pooler config enable_chunked_processing must be true or false")
        n = self.max_embed_len
        if n is None:
            return
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"pooler config max_embed_len must be a positive integer, got {n!r}")
        if not self.enable_chunked_processing:
            raise ValueError(
                "pooler config max_embed_len caps embed inputs for chunked processing; "
                "it needs enable_chunked_processing: true"
            )

    @property
    def sequence_pooling(self) -> str | None:
        """CLS, LAST or MEAN from ``seq_pooling_type`` or the ``pooling_type`` alias."""
        value = self.seq_pooling_type or (self.pooling_type if (self.pooling_type or "").upper() in SEQ_TYPES else None)
        return value.upper() if value else None

    @property
    def token_pooling(self) -> str | None:
        value = self.tok_pooling_type or (self.pooling_type if (self.pooling_type or "").upper() in TOK_TYPES else None)
        return value.upper() if value else None

    @classmethod
    def from_json(cls, text: str) -> PoolerConfig:
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--pooler-config is not JSON: {exc}") from None
        return cls.from_dict(body)

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> PoolerConfig:
        if not isinstance(body, dict):
            raise ValueError("--pooler-config must be a JSON object")
        if "normalize" in body:
            raise ValueError("`normalize` was removed from the pooler config; use `use_activation` instead.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f"--pooler-config has unknown keys {unknown}; known: {sorted(known)}")
        body = dict(body)
        if isinstance(body.get("returned_token_ids"), list):
            body["returned_token_ids"] = tuple(body["returned_token_ids"])
        try:
            return cls(**body)
        except TypeError as exc:
            raise ValueError(f"--pooler-config: {exc}") from None

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)
