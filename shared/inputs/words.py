"""The ``words`` tokenizer: one id per whitespace word, hashed; for models with no vocabulary (zero-cost, test).

A ``TokenizerFiles`` of kind ``words`` describes it (``tokenizer_json`` holds
its few numbers); the zero-cost model of ``poolgate bench --gateway-only
--tokenizer words`` serves it, so what is measured is the gateway without any
tokenizing cost. A word's id is ``offset + crc32(word) % buckets`` (the same
in every process), between ``cls`` and ``sep``; a pair is ``[cls] a [sep] b
[sep]`` with token type 1 from ``b`` on; a chat renders as ``<role> content``
per message (``<assistant>`` opens a reply). Decoding gives the ids' numbers:
a hash cannot be read back.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from poolgate.shared.inputs.encoded import Encoded
from poolgate.shared.inputs.pylate_roles import RoleEncoder
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.wire.messages import ChatInput, TextPair


@dataclass(frozen=True)
class WordSettings:
    """The ``words`` tokenizer's numbers (module doc)."""

    offset: int = 1000
    buckets: int = 40000
    cls: int = 101
    sep: int = 102

    def files(self) -> TokenizerFiles:
        return TokenizerFiles(json.dumps(self.__dict__, sort_keys=True), chat_template="words", kind="words")


class WordEncoder:
    """The ``words`` tokenizer (module doc), with the methods of ``shared.inputs.encoded.TextEncoder``."""

    roles: RoleEncoder | None = None
    score_template = None
    do_lower_case = False
    chat_template: str | None = "words"

    def __init__(self, files: TokenizerFiles | None = None):
        self.files = files or WordSettings().files()
        self.settings = WordSettings(**json.loads(self.files.tokenizer_json))

    def word_id(self, word: str) -> int:
        return self.settings.offset + zlib.crc32(word.encode()) % self.settings.buckets

    def _ids(self, text: str) -> list[int]:
        return [self.word_id(w) for w in text.split()]

    def encode(
        self, texts: list[str], max_tokens: int | None = None, *, add_special_tokens: bool = True, side: str = "right"
    ) -> list[list[int]]:
        """Each text's word ids (between ``cls`` and ``sep`` unless told not to), cut to ``max_tokens``."""
        s, out = self.settings, []
        specials = 2 if add_special_tokens else 0
        for text in texts:
            ids = self._ids(text)
            if max_tokens is not None:
                keep = max(max_tokens - specials, 0)
                ids = (ids[len(ids) - keep :] if keep else []) if side == "left" else ids[:keep]
            out.append([s.cls, *ids, s.sep] if add_special_tokens else ids)
        return out

    def encode_pairs(self, pairs: list[TextPair], max_tokens: int | None = None) -> Encoded:
        """``[cls] a [sep] b [sep]`` per pair (each side cut to its cap first), type 1 from ``b`` on."""
        s, ids, types = self.settings, [], []
        for p in pairs:
            a = [s.cls, *self._ids(self.cut(p.text, p.max_text_tokens)), s.sep]
            b = [*self._ids(self.cut(p.text_pair, p.max_pair_tokens)), s.sep]
            ids.append([*a, *b][:max_tokens])
            types.append(([0] * len(a) + [1] * len(b))[:max_tokens])
        return Encoded(ids, list(types))

    def cut(self, text: str, max_tokens: int) -> str:
        """The first ``max_tokens`` words (0 = all)."""
        return " ".join(text.split()[:max_tokens]) if max_tokens > 0 else text

    def token_spans(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        """Each word's character span."""
        spans, at = [], 0
        for word in text.split():
            at = text.index(word, at)
            spans.append((at, at + len(word)))
            at += len(word)
        return text, spans

    def room(self, query: str | None, instruction: str | None, max_query_tokens: int) -> int:
        """The special tokens, and with a query its words (cut to ``max_query_tokens``) and one more ``sep``."""
        if query is None:
            return 2
        return 3 + len(self.cut(query, max_query_tokens).split())

    def render_chat(self, chat: ChatInput) -> str:
        """``<role> content`` per message; ``<assistant>`` to open a reply."""
        text = " ".join(f"<{m['role']}> {m['content']}" for m in chat.messages)
        return f"{text} <assistant>" if chat.add_generation_prompt else text

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        specials = (self.settings.cls, self.settings.sep) if skip_special_tokens else ()
        return " ".join(str(i) for i in ids if i not in specials)

    def token_strs(self, ids: list[int]) -> list[str | None]:
        return [None] * len(ids)

    def special_token_id(self, name: str) -> int | None:
        return {"cls_token": self.settings.cls, "sep_token": self.settings.sep}.get(name)
