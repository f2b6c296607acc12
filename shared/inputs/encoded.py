"""What the input stage makes of a call (torch-free): token ids per sequence and their plan; the encoder protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from poolgate.shared.domain.windows import Windows
from poolgate.shared.wire.media import SequenceMedia
from poolgate.shared.wire.messages import ChatInput, TextPair

if TYPE_CHECKING:
    from poolgate.shared.inputs.late_plan import LatePlan
    from poolgate.shared.inputs.pylate_roles import RoleEncoder
    from poolgate.shared.inputs.tokenizer_files import TokenizerFiles


@dataclass(frozen=True)
class Encoded:
    """Token ids per sequence, and per sequence its token type ids (None: all segment 0); one sequence per
    input, but for windowed documents, which ``windows`` maps back to their inputs (``shared.domain.windows``)."""

    ids: list[list[int]]
    type_ids: list[list[int] | None]
    windows: Windows | None = None
    late: LatePlan | None = None  # a late-chunking call's chunks (shared.inputs.late_plan)
    attend: list[list[bool] | None] | None = None  # per sequence, the keys attended (shared.inputs.pylate_roles)
    media: list[SequenceMedia] | None = None  # per sequence, its processed images/clips (shared.inputs.media)

    def prompt_tokens(self) -> list[int]:
        """Each input's token count (a windowed document: all its windows' tokens)."""
        lengths = [len(x) for x in self.ids]
        if self.windows is None:
            return lengths
        starts = self.windows.starts().tolist()
        return [sum(lengths[s : s + c]) for s, c in zip(starts, self.windows.counts, strict=True)]


class TextEncoder(Protocol):
    """Texts to token ids and back; the real one is ``shared.inputs.tokenizer.TextEncoder`` (and, for models with
    no vocabulary, ``shared.inputs.words.WordEncoder``)."""

    files: TokenizerFiles  # what it was built from (the gateway gets the same from the worker)
    roles: RoleEncoder | None  # a PyLate model's queries and documents
    chat_template: str | None

    def render_chat(self, chat: ChatInput) -> str:
        """The conversation as text, by the model's chat template."""
        ...

    def special_token_id(self, name: str) -> int | None:
        """The id of the special token ``name`` (``"cls_token"``, ...), None when it has none."""
        ...

    def encode_pairs(self, pairs: list[TextPair], max_tokens: int | None = None) -> Encoded:
        """Each pair as one sequence in the tokenizer's pair template, with its token type ids (cross-encoders)."""
        ...

    def cut(self, text: str, max_tokens: int) -> str:
        """``text`` up to the end of its ``max_tokens``-th content token (0 = the whole text)."""
        ...

    def token_spans(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        """The text the tokenizer sees (lower-cased where the model lower-cases) and each content token's
        character span in it."""
        ...

    def room(self, query: str | None, instruction: str | None, max_query_tokens: int) -> int:
        """The tokens a document window shares its sequence with: special tokens, and with a query the
        query (cut to ``max_query_tokens``) or the score template's prompt."""
        ...

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str: ...

    def token_strs(self, ids: list[int]) -> list[str | None]: ...

    def encode(
        self, texts: list[str], max_tokens: int | None = None, *, add_special_tokens: bool = True, side: str = "right"
    ) -> list[list[int]]:
        """Ids (with the special tokens unless told not to); with ``max_tokens``, truncated as
        sentence-transformers does."""
        ...
