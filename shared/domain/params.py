"""Dialect-free pooling parameters that travel with every call."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from poolgate.shared.domain.tasks import PoolingTask


@dataclass(frozen=True)
class PoolingParams:
    """What the caller asked of the pooler and the tokenizer.

    ``truncate_prompt_tokens``: None = no truncation (unless the server runs
    with auto-truncate), -1 = the task's input cap (the model's max length, or
    ``max_embed_len`` for embed with chunked processing), k > 0 = keep k tokens.
    ``use_activation``: None = the model's default (L2-normalize for embed).
    ``truncation_side``: which end truncation cuts ("right": keep the first
    tokens); special tokens are kept either way.
    """

    task: PoolingTask = "embed"
    dimensions: int | None = None
    use_activation: bool | None = None
    truncate_prompt_tokens: int | None = None
    add_special_tokens: bool = True  # False: the texts are tokenized without CLS/SEP (BOS/EOS)
    truncation_side: str = "right"  # "left": truncation keeps the last tokens (vLLM's truncation_side; Cohere START)
    sparse: bool = False  # answer each input's sparse vector (shared.domain.sparse) instead of the task's rows
    return_tokens: bool = False  # with sparse: each id's token string too
    # a model that encodes queries and documents differently (PyLate ColBERT: ModelInfo.input_roles): the call's
    # first query_inputs inputs are queries, the rest documents; None = no roles
    query_inputs: int | None = None
    # the task LoRA adapter this call's forward runs with (Jina's request field ``task``; ModelInfo.adapters),
    # None = the model's default; only a model served with per-request adapters takes other than its merged one
    adapter: str | None = None
    # the run-time LoRA adapter (``--lora-modules`` / ``/v1/load_lora_adapter``) the request's ``model`` named: the
    # gateway sets it when it routes an adapter's name to its base model's pools; None = the base model
    lora: str | None = None
    # further outputs of the same forward (a multi-output call): each its own params (task, dimensions,
    # sparse, ...) with this call's tokenizing params; the call answers one block per output, its own first
    outputs: tuple[PoolingParams, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> PoolingParams:
        body = dict(body)
        body["outputs"] = tuple(cls.from_wire(o) for o in body.get("outputs") or ())
        return cls(**body)

    def all_outputs(self) -> tuple[PoolingParams, ...]:
        """Every output this call asks for, its own first (the further ones as they were given)."""
        return (self, *self.outputs) if self.outputs else (self,)
