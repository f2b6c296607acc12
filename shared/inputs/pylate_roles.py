"""Queries and documents of a PyLate ColBERT model as PyLate tokenizes them: markers, [MASK] expansion, lengths.

A call of such a model says its inputs' roles (``PoolingParams.query_inputs``:
the first that many are queries, the rest documents). Each text is stripped
(sentence-transformers' Transformer does) and tokenized with the model's
special tokens, cut to its role's length less the marker, and gets its
marker token after the first token, as ``ColBERT.tokenize`` does:

- a query: ``[CLS] [Q] text [SEP]`` then, with query expansion, the
  expansion token up to ``query_length``; those tokens are keys no token
  attends unless ``attend_to_expansion_tokens`` (``Sequence.attend``);
- a document: ``[CLS] [D] text [SEP]`` within ``document_length``.

A request's ``truncate_prompt_tokens`` lowers the role's length. Only texts
take roles: token ids, pairs and chat inputs are refused, and so is a call
without roles or without special tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams


@dataclass(frozen=True)
class PyLateSettings:
    """The resolved settings (``workers.load.pylate`` reads them): marker ids, lengths, the expansion token and
    the skiplist's ids."""

    query_id: int
    document_id: int
    query_length: int
    document_length: int
    expand: bool  # pad queries to query_length with expansion_id
    attend_expansion: bool  # the expansion tokens are keys the other tokens attend
    expansion_id: int
    skiplist: frozenset[int]

    def to_wire(self) -> dict[str, Any]:
        return {**asdict(self), "skiplist": sorted(self.skiplist)}

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> PyLateSettings:
        return cls(**{**body, "skiplist": frozenset(body["skiplist"])})


NO_ROLES = (
    "this model (PyLate ColBERT) encodes queries and documents differently: say which the inputs are "
    "(input_type query or document)"
)


class RoleEncoder:
    """Token ids and key masks by role, for one model's settings and text encoder."""

    def __init__(self, settings: PyLateSettings, encoder: Any):  # a shared.inputs.encoded.TextEncoder
        self.settings, self.encoder = settings, encoder

    def encode(
        self, inputs: list[Any], params: PoolingParams, k: int | None
    ) -> tuple[list[list[int]], list[list[bool] | None]]:
        """(ids, attend) per input; ``attend`` None where every token is a key."""
        if params.query_inputs is None:
            raise InvalidRequest(NO_ROLES, param="input_type")
        if not params.add_special_tokens:
            raise InvalidRequest(
                "a PyLate model's markers follow its first special token: add_special_tokens must stay true",
                param="add_special_tokens",
            )
        if not all(isinstance(x, str) for x in inputs):
            raise InvalidRequest(
                "a PyLate model's queries and documents are texts: pass the inputs as strings", param="input"
            )
        n = params.query_inputs
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(inputs):
            raise InvalidRequest(
                f"query_inputs must be between 0 and the {len(inputs)} inputs, got {n!r}", param="query_inputs"
            )
        queries = self._queries([x.strip() for x in inputs[:n]], k)
        documents = self._documents([x.strip() for x in inputs[n:]], k)
        return [q for q, _ in queries] + documents, [a for _, a in queries] + [None] * len(documents)

    def _length(self, role_length: int, k: int | None) -> int:
        length = role_length if k is None else min(role_length, k)
        if length < 3:
            raise InvalidRequest(
                f"{length} tokens cannot hold a PyLate marker with the special tokens", param="truncate_prompt_tokens"
            )
        return length

    def _marked(self, texts: list[str], marker: int, length: int) -> list[list[int]]:
        if not texts:
            return []
        return [ids[:1] + [marker] + ids[1:] for ids in self.encoder.encode(texts, max_tokens=length - 1)]

    def _queries(self, texts: list[str], k: int | None) -> list[tuple[list[int], list[bool] | None]]:
        s = self.settings
        length = self._length(s.query_length, k)
        out: list[tuple[list[int], list[bool] | None]] = []
        for ids in self._marked(texts, s.query_id, length):
            if not s.expand:
                out.append((ids, None))
                continue
            pad = length - len(ids)
            attend = None if s.attend_expansion or not pad else [True] * len(ids) + [False] * pad
            out.append((ids + [s.expansion_id] * pad, attend))
        return out

    def _documents(self, texts: list[str], k: int | None) -> list[list[int]]:
        return self._marked(texts, self.settings.document_id, self._length(self.settings.document_length, k))
