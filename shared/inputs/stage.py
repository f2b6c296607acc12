"""The input stage: check a call, shape and tokenize its inputs (truncated as asked), check their lengths.

This runs in front of the queue, where the model's tokenizer is: in the
gateway's tokenizer pool (``gateway.tokenizing``) or the offline API's, never
on an event loop (``shared.inputs.front`` calls it). A call of plain texts goes
through the tokenizer in one batched ``encode``, truncated by the tokenizer's
own truncation as sentence-transformers does, so the ids match it exactly. Lengths are
checked against the input cap (``shared.domain.limits.input_cap``): with chunked
processing an embed input may be longer than ``max_model_len``, and the engine
splits it (``workers.engine.chunking``). A ``CappedText`` is cut to its content-token
cap first and then tokenized as a text; a cross-encoder's ``TextPair`` goes
through the tokenizer's pair template (``TextEncoder.encode_pairs``) and keeps
its token type ids. A long document to score in windows (``WindowedText``) is
cut into one input per window first (``shared.inputs.window_cuts``). A PyLate model's inputs are
tokenized by their role instead (``shared.inputs.pylate_roles``).
"""

from __future__ import annotations

from dataclasses import replace

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.late_chunks import TOKEN_TASK, LateChunkText
from poolgate.shared.domain.limits import cap_task, check_call, check_length, check_token_ids, truncation_length
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs import late_plan as late_chunking
from poolgate.shared.inputs.encoded import Encoded, TextEncoder
from poolgate.shared.inputs.media.plans import plan_for
from poolgate.shared.inputs.window_cuts import Expanded, expand, shrink, window_input
from poolgate.shared.wire.media import MediaInput
from poolgate.shared.wire.messages import (
    CappedText,
    ChatInput,
    Input,
    ModelInfo,
    PoolingCall,
    TextPair,
    WindowedText,
    only_texts,
)


class InputStage:
    """Turns a call's inputs into checked token-id lists for one model."""

    def __init__(self, info: ModelInfo, encoder: TextEncoder, limits: MediaLimits | None = None):
        self.info, self.encoder = info, encoder
        self.media = plan_for(info, encoder)  # a media model's plan (shared.inputs.media); None for text models
        self.limits = limits or MediaLimits()

    def check(self, call: PoolingCall) -> None:
        """Task, params and input types: raises the 4xx before any tokenizing."""
        check_call(self.info, call)

    def tokenize(self, call: PoolingCall) -> list[list[int]]:
        """Token ids per input, in order, truncated as asked and checked against the model."""
        return self.encode(call).ids

    def encode(self, call: PoolingCall) -> Encoded:
        """``tokenize`` with each input's token type ids (None but for a cross-encoder's pairs); a
        ``WindowedText`` becomes one sequence per window (``shared.inputs.window_cuts``), named in ``windows``."""
        if self.media is not None:  # a media model: its plan shapes every call (shared.inputs.media)
            if not getattr(self.media, "renders_chats", False):
                _no_chat_options(self.info, call)
            return self.media.encode(call, self.limits)
        media = next((x for x in call.inputs if isinstance(x, MediaInput) and x.media), None)
        if media is not None:
            kinds = sorted(media.kinds - {"text"})
            raise InvalidRequest(
                f"model {self.info.served_model_name!r} reads text only; an input holds {' and '.join(kinds)}",
                param="input",
            )
        call = _as_texts(call)
        k = truncation_length(self.info, call.params)
        if (
            getattr(self.encoder, "roles", None) is not None
        ):  # PyLate: queries and documents (shared.inputs.pylate_roles)
            return self._encode_roles(call, k)
        if call.params.query_inputs is not None:
            raise InvalidRequest(
                "this model encodes queries and documents alike: query_inputs does not apply", param="query_inputs"
            )
        if (texts := only_texts(call.inputs)) is not None:  # the common call, plain texts: one batch call
            return self._encode_texts(texts, k, call.params)
        inputs = render_chats(self.encoder, call.inputs)
        late = [x for x in inputs if isinstance(x, LateChunkText)]  # a late-chunking call holds only these
        inputs = [x.text for x in late] if late else inputs
        cap = self.info.max_model_len if k is None else min(k, self.info.max_model_len)
        expanded = expand(self.encoder, inputs, cap)
        encoded = self._encode_inputs(inputs if expanded is None else expanded.inputs, k, call.params)
        if expanded is not None:
            self._fit_windows(expanded, encoded, cap, k, call.params)
            encoded = replace(encoded, windows=expanded.windows())
        if late:  # shared.inputs.late_plan: one sequence per document, a vector per chunk
            encoded = replace(encoded, late=late_chunking.plan(self.encoder, late, encoded.ids, call.params))
        for x in encoded.ids:
            check_length(self.info, len(x), TOKEN_TASK if late else cap_task(call.params))
        return encoded

    def _encode_texts(self, texts: list[str], k: int | None, params: PoolingParams) -> Encoded:
        """Plain texts, tokenized (and truncated) in one batch call, each checked against the input cap."""
        side = params.truncation_side
        ids = self.encoder.encode(texts, max_tokens=k, add_special_tokens=params.add_special_tokens, side=side)
        if k is not None and any(len(x) > k for x in ids):  # k below a tokenizer's special-token count keeps k
            ids = [x[-k:] if side == "left" else x[:k] for x in ids]
        task = cap_task(params)
        for x in ids:
            check_length(self.info, len(x), task)
        return Encoded(ids, [None] * len(ids))

    def _encode_roles(self, call: PoolingCall, k: int | None) -> Encoded:
        if any(isinstance(x, (WindowedText, LateChunkText)) for x in call.inputs):
            raise InvalidRequest(
                "a PyLate model's documents are cut to its document_length: windows and late chunking do not apply",
                param="input",
            )
        inputs = [self.encoder.cut(x.text, x.max_tokens) if isinstance(x, CappedText) else x for x in call.inputs]
        roles = self.encoder.roles
        assert roles is not None  # encode sends only a PyLate model's calls here
        ids, attend = roles.encode(inputs, call.params, k)
        for x in ids:
            check_length(self.info, len(x), cap_task(call.params))
        return Encoded(ids, [None] * len(ids), attend=attend)

    def _encode_inputs(self, inputs: list[Input], k: int | None, params: PoolingParams) -> Encoded:
        inputs = [self.encoder.cut(x.text, x.max_tokens) if isinstance(x, CappedText) else x for x in inputs]
        pairs = [i for i, x in enumerate(inputs) if isinstance(x, TextPair)]
        ids = self._encode(
            [x if not isinstance(x, TextPair) else [] for x in inputs],
            k,
            params.add_special_tokens,
            params.truncation_side,
        )
        types: list[list[int] | None] = [None] * len(ids)
        if pairs:
            encoded = self.encoder.encode_pairs([x for x in inputs if isinstance(x, TextPair)], k)
            for i, pair_ids, pair_types in zip(pairs, encoded.ids, encoded.type_ids, strict=True):
                ids[i], types[i] = pair_ids, pair_types
        return Encoded(ids, types)

    def _fit_windows(
        self, expanded: Expanded, encoded: Encoded, cap: int, k: int | None, params: PoolingParams
    ) -> None:
        """Cut (in place) each window whose re-tokenized text came out over ``cap`` tokens."""
        for j, source in enumerate(expanded.sources):
            for _ in range(3):
                if source is None or len(encoded.ids[j]) <= cap:
                    break
                doc, text = source
                expanded.spans[j] = shrink(self.encoder, text, expanded.spans[j], len(encoded.ids[j]) - cap)
                expanded.inputs[j] = window_input(doc, text, expanded.spans[j])
                again = self._encode_inputs([expanded.inputs[j]], k, params)
                encoded.ids[j], encoded.type_ids[j] = again.ids[0], again.type_ids[0]

    def tokenize_one(self, x: Input, *, add_special_tokens: bool = True) -> list[int]:
        """One text's (or rendered chat's) ids as /tokenize reports them: untruncated, lengths unchecked."""
        text = render_chats(self.encoder, [x])[0]
        if not isinstance(text, str):
            raise InvalidRequest("/tokenize takes a prompt text or chat messages", param="prompt")
        return self.encoder.encode([text], add_special_tokens=add_special_tokens)[0]

    def detokenize(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (special tokens kept unless asked, as vLLM's /detokenize; TEI's /decode skips
        them); 400 for ids out of vocabulary."""
        check_token_ids(self.info, ids)
        return self.encoder.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_offsets(self, text: str, ids: list[int]) -> tuple[list[list[int] | None], list[bool]]:
        """For ``ids`` (``text`` tokenized, special tokens maybe added): each token's character span in the text
        the tokenizer saw (None for a special token) and whether it is special. The content tokens are the
        ids of the text without special tokens, found as one run inside ``ids``."""
        content = self.encoder.encode([text], add_special_tokens=False)[0]
        _, spans = self.encoder.token_spans(text)
        start = next((k for k in range(len(ids) - len(content) + 1) if ids[k : k + len(content)] == content), None)
        if start is None or len(spans) != len(content):
            raise InvalidRequest("this tokenizer's special tokens cannot be told from the text's", param="inputs")
        offsets: list[list[int] | None] = [None] * len(ids)
        for i, span in enumerate(spans):
            offsets[start + i] = list(span)
        return offsets, [o is None for o in offsets]

    def _encode(self, inputs: list[Input], k: int | None, special: bool = True, side: str = "right") -> list[list[int]]:
        """Each text's ids (truncated to ``k`` as the tokenizer truncates, in one batch call), token ids as given
        (cut to ``k``)."""
        ids: list[list[int]] = [list(x) if isinstance(x, list) else [] for x in inputs]
        texts = [(i, x) for i, x in enumerate(inputs) if isinstance(x, str)]
        if texts:
            encoded = self.encoder.encode([x for _, x in texts], max_tokens=k, add_special_tokens=special, side=side)
            for (i, _), one in zip(texts, encoded, strict=True):
                ids[i] = one
        if k is None:
            return ids
        # k below a tokenizer's special-token count still keeps k
        return [x[-k:] if side == "left" else x[:k] for x in ids]


def _no_chat_options(info: ModelInfo, call: PoolingCall) -> None:
    """400 for chat options on a media model that reads a chat's parts without a template (never ignored)."""
    for i, x in enumerate(call.inputs):
        if isinstance(x, MediaInput) and x.chat_options:
            raise InvalidRequest(
                f"input[{i}]: model {info.served_model_name!r} reads a conversation's parts without a chat "
                f"template, so {', '.join(x.chat_options)} cannot apply; send the request without it",
                param=x.chat_options[0],
            )


def _as_texts(call: PoolingCall) -> PoolingCall:
    """A call whose ``MediaInput``s hold only text (a content list of text parts) with each as its text."""
    if not any(isinstance(x, MediaInput) for x in call.inputs):
        return call
    return replace(call, inputs=[x.text if isinstance(x, MediaInput) else x for x in call.inputs])


def render_chats(encoder: TextEncoder, inputs: list[Input]) -> list[Input]:
    """Each ``ChatInput`` rendered to its text with the model's chat template (the tokenizer's
    ``apply_chat_template``, as vLLM does); the text is then tokenized like any other, with the
    call's ``add_special_tokens`` (False by default for chat requests, since templates add their own)."""
    return [encoder.render_chat(x) if isinstance(x, ChatInput) else x for x in inputs]
