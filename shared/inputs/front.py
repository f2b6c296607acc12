"""One model's input stage in front of the queue: a ``PoolingCall`` to the ``TokenCall`` a worker runs, and back.

``prepare`` (in a thread: it tokenizes) checks the call, shapes and tokenizes
its inputs (``shared.inputs.stage``), counts each input's tokens, checks the
count against the model's ``max_tokens_per_request`` and packs the sequences
into one ``TokenCall``; what the answer needs later (windows, a late-chunking
plan, the call's own params) stays in the ``Prepared``. ``finish`` turns the
worker's answer (one row per sequence) into the call's: sparse rows with their
token strings, late chunks folded to one vector each, windows named, token
counts per input and the tokenizing time. The gateway runs both around its
pools; the offline API around its engine. ``tokenize``, ``token_details`` and
``detokenize`` answer the tokenizer routes (vLLM's and TEI's) where the
tokenizer is, with no worker involved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from poolgate.shared.domain.limits import check_tokens
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs.encoded import Encoded, TextEncoder
from poolgate.shared.inputs.sparse_output import SparseOutput
from poolgate.shared.inputs.stage import InputStage
from poolgate.shared.wire.messages import Input, ModelInfo, PoolingCall, PoolingResult
from poolgate.shared.wire.rows import Rows
from poolgate.shared.wire.token_call import TokenCall


@dataclass(frozen=True, eq=False)
class Prepared:
    """A call tokenized: what the worker runs, and what turns its answer into the call's."""

    call: TokenCall
    plan: Encoded  # the sequences' ids, windows and late-chunking plan
    params: PoolingParams  # the call's own (a late-chunking call runs token vectors)
    prompt_tokens: list[int]  # per input, counted (a windowed document: every window)
    tokenize_s: float

    @property
    def total_tokens(self) -> int:
        return sum(self.prompt_tokens)


class Front:
    """``prepare`` and ``finish`` for one model (module doc)."""

    def __init__(self, info: ModelInfo, encoder: TextEncoder, limits: MediaLimits | None = None):
        self.info, self.encoder = info, encoder
        self.stage = InputStage(info, encoder, limits)  # limits: the model's on images and audio
        self.sparse = SparseOutput(info, encoder)

    def prepare(self, call: PoolingCall) -> Prepared:
        """The call checked, tokenized and counted (module doc); raises its 4xx."""
        start = time.perf_counter()
        self.stage.check(call)
        plan = self.stage.encode(call)
        prompt_tokens = plan.prompt_tokens()
        check_tokens(sum(prompt_tokens), self.info.max_tokens_per_request)
        tokens = TokenCall.pack(
            call.request_id,
            call.model,
            plan.ids,
            type_ids=plan.type_ids,
            attend=plan.attend,
            media=plan.media,
            params=call.params if plan.late is None else plan.late.params,
            deadline=call.deadline,
            priority=call.priority,
            trace_context=call.trace_context,
            lane=call.lane,
        )
        return Prepared(tokens, plan, call.params, prompt_tokens, time.perf_counter() - start)

    def finish(self, prepared: Prepared, result: PoolingResult) -> PoolingResult:
        """The call's answer from the worker's one row per sequence (module doc)."""
        plan, params = prepared.plan, prepared.params
        rows, tokens = self._sparse(result.outputs, plan, params)
        windows = plan.windows
        if plan.late is not None:  # shared.inputs.late_plan: a vector per chunk
            rows, windows = plan.late.fold(rows)
        more = []
        for extra, output in zip(result.more, params.outputs, strict=True):
            extra_rows, extra_tokens = self._sparse(extra.outputs, plan, output)
            more.append(PoolingResult(extra_rows, prepared.prompt_tokens, tokens=extra_tokens))
        timings = {**result.timings, "tokenize_s": prepared.tokenize_s}
        return PoolingResult(rows, prepared.prompt_tokens, timings, windows, tokens, more)

    def tokenize(
        self, x: Input, add_special_tokens: bool, token_strs: bool
    ) -> tuple[list[int], list[str | None] | None]:
        """One text's (or chat's) ids as ``/tokenize`` reports them, and each id's token string when asked."""
        ids = self.stage.tokenize_one(x, add_special_tokens=add_special_tokens)
        return ids, self.encoder.token_strs(ids) if token_strs else None

    def token_details(self, text: str, add_special_tokens: bool) -> dict[str, Any]:
        """A text's ``tokens``, ``token_strs``, ``offsets`` (None for a special token) and ``special`` flags."""
        ids = self.stage.tokenize_one(text, add_special_tokens=add_special_tokens)
        offsets, special = self.stage.token_offsets(text, ids)
        return {"tokens": ids, "token_strs": self.encoder.token_strs(ids), "offsets": offsets, "special": special}

    def detokenize(self, ids: list[int], skip_special_tokens: bool) -> str:
        """The text of ``ids`` (400 for ids out of vocabulary)."""
        return self.stage.detokenize(ids, skip_special_tokens=skip_special_tokens)

    def _sparse(self, rows: Rows, plan: Encoded, params: PoolingParams) -> tuple[Rows, list[list[str | None]] | None]:
        """A sparse output's rows as each input's ``{token id: weight}`` (others as they are)."""
        return self.sparse(rows, plan.ids, params) if params.sparse else (rows, None)
