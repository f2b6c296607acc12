"""The request body every pooling route shares (vLLM's completion style): its fields, and removed names refused.

Like vLLM's ``OpenAIBaseModel``, unknown fields are allowed and ignored, but
the names vLLM removed (``normalize``; ``task: "score"`` / ``"encode"``) are
answered with vLLM's 400 before any field is validated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.tasks import REMOVED_TASKS
from poolgate.shared.wire.messages import Input

# Strict, so "1" is not a token id and 1 is not a text; ids fit an int32 vocabulary.
TokenId = Annotated[StrictInt, Field(ge=0, lt=2**31)]
CompletionInput = StrictStr | list[StrictStr] | list[TokenId] | list[list[TokenId]]

# vLLM's reject_removed_pooling_parameters: name -> message.
REMOVED_PARAMS: dict[str, str] = {
    "normalize": "Parameter `normalize` was removed; use `use_activation` instead.",
}


def reject_removed(data: Any) -> Any:
    """A body (before validation) that names no parameter or task vLLM removed; 400 with vLLM's message."""
    if not isinstance(data, dict):
        return data
    for name, message in REMOVED_PARAMS.items():
        if name in data:
            raise InvalidRequest(message, param=name)
    task = data.get("task")
    if isinstance(task, str) and task in REMOVED_TASKS:
        raise InvalidRequest(REMOVED_TASKS[task], param="task")
    return data


def as_batch(value: str | Sequence[str | int | list[int]]) -> list[Input]:
    """A lone text or one list of token ids is a batch of one; a list of texts or id lists is the batch."""
    if isinstance(value, str):
        return [value]
    ids = [x for x in value if isinstance(x, int)]
    if ids and len(ids) == len(value):
        return [ids]
    if ids:  # (the bodies' types refuse this already)
        raise InvalidRequest("a list of inputs cannot mix token ids with texts or lists of ids", param="input")
    return [x for x in value if not isinstance(x, int)]


class PoolingBody(BaseModel):
    """``model``, ``input``, ``user``, ``truncate_prompt_tokens``, ``use_activation``,
    ``add_special_tokens``, ``truncation_side``, ``priority``; extras ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: CompletionInput
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    use_activation: bool | None = None
    add_special_tokens: bool = True
    truncation_side: Literal["left", "right"] | None = None  # None: right (keep the first tokens)
    priority: int | None = None  # vLLM's: lower runs earlier; None: the tenant's default (else 0)

    @model_validator(mode="before")
    @classmethod
    def _reject_removed(cls, data: Any) -> Any:
        return reject_removed(data)

    def inputs(self) -> list[Input]:
        """``input`` as a list of inputs: one text or one list of ids is one input."""
        return as_batch(self.input)

    def truncation(self) -> dict:
        """The truncation fields of ``PoolingParams`` for this body."""
        return {
            "truncate_prompt_tokens": self.truncate_prompt_tokens,
            "truncation_side": self.truncation_side or "right",
        }
