"""The Open Inference Protocol's request parameters sorted: the protocol's, a model kind's, the refused.

An inference request carries parameters in three places: the request's
``parameters`` map, each input's, and each requested output's. Three sorts:

- the protocol's own (``PROTOCOL``): the binary tensor data extension's
  ``binary_data_output``, ``binary_data_size``, ``binary_data``; the transport
  (REST) honours them, the model never sees them;
- Triton's that poolgate does not implement (``NOT_IMPLEMENTED``): refused
  with a 400 saying what to do instead (``timeout`` → the ``X-Request-Timeout``
  header; a sequence, shared memory, the classification extension); a
  sequence parameter that says "no sequence" (0, "", false) is no request;
- the model's: the request's and every input's maps merged (the same name
  twice with two values is a 400), validated against the model kind's
  ``Options`` (strict types, unknown names a 400 naming them and listing the
  kind's): ``priority`` (poolgate's: lower runs earlier; 0 = the default, as
  Triton's 0; Triton's 1, its highest level, is one step below it here),
  ``truncate`` (bool: cut each input to the model's length) or
  ``truncate_prompt_tokens`` (int, vLLM's: -1 = the model's length, k = keep k
  tokens), and per kind ``EmbedOptions`` / ``ScoreOptions`` / ``ClassifyOptions``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from poolgate.shared.domain.errors import InvalidRequest

PROTOCOL = frozenset({"binary_data_output", "binary_data_size", "binary_data"})
SEQUENCE = "sequence batching is not implemented: poolgate's models are stateless (send no sequence_id)"
SHARED_MEMORY = "shared memory is not implemented: send the tensor's data in the request"
NOT_IMPLEMENTED = {
    "timeout": "Triton's timeout parameter is not implemented: send the X-Request-Timeout header (seconds)",
    "sequence_id": SEQUENCE,
    "sequence_start": SEQUENCE,
    "sequence_end": SEQUENCE,
    "shared_memory_region": SHARED_MEMORY,
    "shared_memory_byte_size": SHARED_MEMORY,
    "shared_memory_offset": SHARED_MEMORY,
    "classification": "Triton's classification extension is not implemented: a classifier answers its "
    "'probabilities' and 'labels' outputs",
}
NO_SEQUENCE = ("sequence_id", "sequence_start", "sequence_end")


class Options(BaseModel):
    """The parameters every model kind takes."""

    model_config = ConfigDict(extra="forbid", strict=True)

    priority: int | None = None
    truncate: bool | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None

    def truncation(self) -> int | None:
        """``PoolingParams.truncate_prompt_tokens``: -1 for ``truncate``, else ``truncate_prompt_tokens``."""
        if self.truncate is not None and self.truncate_prompt_tokens is not None:
            raise InvalidRequest(
                "give parameter 'truncate' or 'truncate_prompt_tokens', not both", param="truncate_prompt_tokens"
            )
        return -1 if self.truncate else self.truncate_prompt_tokens

    def call_priority(self) -> int | None:
        """The call's priority; Triton's 0 means the default (the caller's tenant's, else 0)."""
        return self.priority or None


class EmbedOptions(Options):
    """An embedding model's: ``normalize`` (L2, default true), ``dimensions`` (matryoshka), TEI's
    ``truncation_direction``, and a prompt by ``input_type`` (Cohere's) or ``prompt_name`` (TEI's)."""

    normalize: bool = True
    dimensions: Annotated[int, Field(ge=1)] | None = None
    truncation_direction: Literal["right", "left"] = "right"
    input_type: str | None = None
    prompt_name: str | None = None


class ScoreOptions(Options):
    """A reranker's: ``raw_scores`` (TEI's: the logits, not the model's activation)."""

    raw_scores: bool = False


class ClassifyOptions(ScoreOptions):
    """A classifier's: ``raw_scores`` and ``truncation_direction``."""

    truncation_direction: Literal["right", "left"] = "right"


def passes(key: str, value: Any) -> bool:
    """Whether the model never sees this parameter: the protocol's, or a sequence parameter saying "none"."""
    return key in PROTOCOL or (key in NO_SEQUENCE and value in (0, "", False))


def refuse_unimplemented(key: str, where: str) -> None:
    """400 for a Triton parameter poolgate does not implement (module doc)."""
    if key in NOT_IMPLEMENTED:
        raise InvalidRequest(f"parameter '{key}' ({where}): {NOT_IMPLEMENTED[key]}", param=key)


def merged(sources: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The model's parameters from each ``(where, parameters)`` source, the protocol's left out (module doc)."""
    out: dict[str, Any] = {}
    for where, parameters in sources:
        for key, value in parameters.items():
            if passes(key, value):
                continue
            refuse_unimplemented(key, where)
            if key in out and out[key] != value:
                raise InvalidRequest(f"parameter '{key}' is given twice with different values", param=key)
            out[key] = value
    return out


def check_output_parameters(name: str, parameters: Mapping[str, Any]) -> None:
    """A requested output's parameters: only the protocol's (``binary_data``) are taken."""
    for key, value in parameters.items():
        if passes(key, value):
            continue
        refuse_unimplemented(key, f"output '{name}'")
        raise InvalidRequest(f"unknown parameter '{key}' on output '{name}'; an output takes binary_data", param=key)


def options(model: type[Options], kind: str, parameters: Mapping[str, Any]) -> Options:
    """``parameters`` as the kind's ``model``; 400 naming every unknown parameter, or the first bad value."""
    try:
        return model.model_validate(dict(parameters))
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        unknown = [str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden"]
        if unknown:
            names = ", ".join(f"'{n}'" for n in unknown)
            raise InvalidRequest(
                f"unknown parameter{'s' if len(unknown) > 1 else ''} {names}: {kind} models take "
                + ", ".join(model.model_fields),
                param=unknown[0],
            ) from None
        first = errors[0]
        key = str(first["loc"][0]) if first["loc"] else ""
        raise InvalidRequest(f"parameter '{key}': {first['msg']}, got {first.get('input')!r}", param=key) from None
