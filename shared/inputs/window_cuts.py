"""Cutting a call's long documents (``shared.domain.windows.WindowedText``) into token windows the input stage encodes.

Each ``WindowedText`` becomes one input per window: a ``TextPair`` of the
query and the window's text for a cross-encoder, the window's text alone
otherwise; every other input stays one input. A window is ``size`` content
tokens, ``size`` = the input cap less what shares the sequence with it (the
special tokens, the query, a score template's prompt: ``TextEncoder.room``);
window k starts at token ``k * (size - overlap)``, and at most
``max_windows`` are cut. A document that fits one window is one window over
its whole text, so it reads exactly as the un-windowed input. A window's
text is the document's characters from its first token's start to its last
token's end; re-tokenized, a cut can come out a token or two longer at its
edges, so ``shrink`` cuts a window that no longer fits and names its new span.
"""

from __future__ import annotations

from dataclasses import dataclass

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.windows import Windows
from poolgate.shared.inputs.encoded import TextEncoder
from poolgate.shared.wire.messages import Input, TextPair, WindowedText

Span = tuple[int, int]


@dataclass(frozen=True)
class Expanded:
    """A call's inputs, one per window, and for each the document it was cut from (None: not windowed)."""

    inputs: list[Input]
    sources: list[tuple[WindowedText, str] | None]  # (the document, the text its spans index)
    counts: list[int]  # per call input: how many inputs it became
    spans: list[Span]  # per expanded input

    def windows(self) -> Windows:
        return Windows(tuple(self.counts), tuple(self.spans))


def expand(encoder: TextEncoder, inputs: list[Input], cap: int) -> Expanded | None:
    """The inputs to encode (one per window) and how they map back; None when no input is windowed."""
    if not any(isinstance(x, WindowedText) for x in inputs):
        return None
    out = Expanded([], [], [], [])
    for x in inputs:
        if not isinstance(x, WindowedText):
            out.inputs.append(x)
            out.sources.append(None)
            out.counts.append(1)
            out.spans.append((0, 0))
            continue
        text, doc_spans = _spans(encoder, x, cap)
        out.inputs.extend(window_input(x, text, span) for span in doc_spans)
        out.sources.extend([(x, text)] * len(doc_spans))
        out.counts.append(len(doc_spans))
        out.spans.extend(doc_spans)
    return out


def window_input(doc: WindowedText, text: str, span: Span) -> Input:
    """What one window is read as: the query with the window's text, or that text alone."""
    piece = text[span[0] : span[1]]
    if doc.query is None:
        return piece
    return TextPair(doc.query, piece, doc.max_query_tokens, 0, doc.instruction)


def _spans(encoder: TextEncoder, doc: WindowedText, cap: int) -> tuple[str, list[Span]]:
    """The text the windows index (the one the tokenizer sees) and each window's character span."""
    size = cap - encoder.room(doc.query, doc.instruction, doc.max_query_tokens)
    if size < 1:
        raise InvalidRequest(
            f"The query leaves no room for a document window: the model reads at most {cap} "
            "tokens per sequence. Shorten the query or set max_tokens_per_query.",
            param="max_chunks_per_doc",
        )
    if doc.overlap >= size:
        raise InvalidRequest(
            f"chunk_overlap ({doc.overlap}) must be smaller than the window ({size} tokens for this query and model).",
            param="chunk_overlap",
        )
    text, offsets = encoder.token_spans(doc.text)
    n = min(len(offsets), doc.max_tokens) if doc.max_tokens else len(offsets)
    if n <= size:
        return text, [(0, len(text) if n == len(offsets) else offsets[n - 1][1])]
    spans, stride = [], size - doc.overlap
    for start in range(0, n, stride):
        end = min(start + size, n)
        spans.append((offsets[start][0], offsets[end - 1][1]))
        if end == n or len(spans) == doc.max_windows:
            break
    return text, spans


def shrink(encoder: TextEncoder, text: str, span: Span, excess: int) -> Span:
    """``span`` cut by ``excess`` tokens at its end (a re-tokenized window that came out too long)."""
    piece = text[span[0] : span[1]]
    _, offsets = encoder.token_spans(piece)
    keep = max(len(offsets) - excess, 1)
    return span[0], span[0] + offsets[keep - 1][1]
