"""Text → token ids with the model's fast tokenizer, truncating as sentence-transformers does; pairs, chats, decoding.

Built from the model's ``TokenizerFiles`` on the Rust ``tokenizers`` library:
no torch, no transformers model classes, so the gateway (and the offline API)
tokenize with it. A call without truncation runs on a tokenizer without state
(any number of threads at once); one with truncation sets the truncating
copy's length first, one caller at a time (transformers' ``truncation=True``
does the same to its backend). Chats render with transformers' own Jinja
renderer (torch-free), with the tokenizer's special tokens as transformers'
``apply_chat_template`` passes them.
"""

from __future__ import annotations

import threading
from typing import Any, cast

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.inputs.encoded import Encoded
from poolgate.shared.inputs.pylate_roles import RoleEncoder
from poolgate.shared.inputs.score_templates import SCORE_TEMPLATES
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.wire.messages import ChatInput, TextPair

# vLLM's message when the tokenizer has no chat template (transformers dropped the default one in 4.44).
NO_CHAT_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must "
    "provide a chat template if the tokenizer does not define one."
)


class TextEncoder:
    """One model's tokenizer, from its ``TokenizerFiles``, on the Rust ``tokenizers`` library (no torch)."""

    def __init__(self, files: TokenizerFiles):
        from tokenizers import Tokenizer

        self.files = files
        self.backend = Tokenizer.from_str(files.tokenizer_json)
        self.backend.no_truncation()
        self.backend.no_padding()
        # A second copy for calls that truncate: its truncation is set before each such call, so one caller
        # at a time (the first copy has no such state and runs on any number of threads at once)
        self._truncating = Tokenizer.from_str(files.tokenizer_json)
        self._truncating.no_padding()
        self._stateful = threading.Lock()
        self.do_lower_case = files.do_lower_case
        self.chat_template = files.chat_template
        self.roles = None if files.roles is None else RoleEncoder(files.roles, self)  # a PyLate model's
        self.score_template = SCORE_TEMPLATES[files.score_template] if files.score_template else None

    def special_token_id(self, name: str) -> int | None:
        """The id of the special token ``name`` (``"cls_token"``, ``"eos_token"``, ...); None when it has none."""
        token = self.files.special_tokens.get(name)
        return None if not isinstance(token, str) else self.backend.token_to_id(token)

    def encode_pairs(self, pairs: list[TextPair], max_tokens: int | None = None) -> Encoded:
        """Each pair as one sequence in the tokenizer's pair template (``[CLS] a [SEP] b [SEP]``), with its
        token type ids (BERT marks the second text 1). Each side is first cut to its own content-token cap
        (``TextPair.max_*_tokens``, at a character boundary, as vLLM does); with ``max_tokens``, the
        longer side is then cut first (the tokenizer's ``longest_first``). A model with a score template
        (``shared.inputs.score_templates``) reads each pair as that prompt instead, with no token type ids."""
        firsts = [self.cut(p.text, p.max_text_tokens) for p in pairs]
        seconds = [self.cut(p.text_pair, p.max_pair_tokens) for p in pairs]
        if self.do_lower_case:
            firsts, seconds = [t.lower() for t in firsts], [t.lower() for t in seconds]
        if self.score_template is not None:  # an LLM reranker's prompt, tokenized whole
            return Encoded(
                [
                    self._template_ids(a, b, p.instruction, max_tokens)
                    for a, b, p in zip(firsts, seconds, pairs, strict=True)
                ],
                [None] * len(pairs),
            )
        if max_tokens is not None and max_tokens < self.backend.num_special_tokens_to_add(True) + 2:
            raise InvalidRequest(
                f"truncate_prompt_tokens={max_tokens} cannot hold a pair: its special tokens "
                "and at least one token of each text",
                param="truncate_prompt_tokens",
            )
        out = self._encode_batch(list(zip(firsts, seconds, strict=True)), max_tokens, add_special_tokens=True)
        return Encoded([e.ids for e in out], [e.type_ids if any(e.type_ids) else None for e in out])

    def _encode_batch(
        self, inputs: list[Any], max_tokens: int | None, *, add_special_tokens: bool, side: str = "right"
    ) -> list[Any]:
        """The tokenizer's batch call; with ``max_tokens``, its own truncation (``longest_first`` for a pair,
        as transformers' ``truncation=True``), on the truncating copy, one caller at a time."""
        if max_tokens is None:
            return self.backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        with self._stateful:
            self._truncating.enable_truncation(max_tokens, strategy="longest_first", direction=side)
            return self._truncating.encode_batch(inputs, add_special_tokens=add_special_tokens)

    def _template_ids(self, query: str, document: str, instruction: str | None, max_tokens: int | None) -> list[int]:
        """The score template's prompt as ids; with ``max_tokens``, the document is cut until the prompt fits
        (the template's own tokens, which the score is read after, are never cut)."""
        template = self.score_template
        assert template is not None  # only a model with a score template comes here
        for _ in range(3):  # a cut can merge differently at its edge: measure again
            ids = self.backend.encode(template(query, document, instruction)).ids
            if max_tokens is None or len(ids) <= max_tokens:
                return ids
            doc_tokens = len(self.backend.encode(document, add_special_tokens=False).ids)
            keep = doc_tokens - (len(ids) - max_tokens)
            if keep <= 0:
                break
            document = self.cut(document, keep)
        raise InvalidRequest(
            f"truncate_prompt_tokens={max_tokens} cannot hold this reranker's prompt: its "
            "template, the query and at least one token of the document",
            param="truncate_prompt_tokens",
        )

    def cut(self, text: str, max_tokens: int) -> str:
        """``text`` up to the end of its ``max_tokens``-th content token (0 = the whole text)."""
        if max_tokens <= 0:
            return text
        # the offsets are into the text the tokenizer sees: lower-cased first where the model lower-cases (a
        # character can change length, "İ" → "i̇"), so that text is the one cut (it is lower-cased again later)
        seen = text.lower() if self.do_lower_case else text
        encoding = self.backend.encode(seen, add_special_tokens=False)
        if len(encoding.ids) <= max_tokens:
            return text
        return seen[: encoding.offsets[max_tokens - 1][1]]

    def token_spans(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        """The text the tokenizer sees (lower-cased first where the model lower-cases) and each content
        token's character span in it (the windows of a long document: ``shared.inputs.window_cuts``)."""
        seen = text.lower() if self.do_lower_case else text
        return seen, [(a, b) for a, b in self.backend.encode(seen, add_special_tokens=False).offsets]

    def room(self, query: str | None, instruction: str | None, max_query_tokens: int) -> int:
        """The tokens a document window shares its sequence with: the special tokens and the query (cut to
        ``max_query_tokens``), or with a score template its whole prompt around an empty document."""
        if query is None:
            return self.backend.num_special_tokens_to_add(False)
        query = self.cut(query, max_query_tokens)
        query = query.lower() if self.do_lower_case else query
        if self.score_template is not None:
            return len(self.backend.encode(self.score_template(query, "", instruction)).ids)
        return self.backend.num_special_tokens_to_add(True) + len(
            self.backend.encode(query, add_special_tokens=False).ids
        )

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (the tokenizer's own decoding)."""
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_strs(self, ids: list[int]) -> list[str | None]:
        """Each id's token string in the vocabulary (None for an id it does not have)."""
        return [self.backend.id_to_token(i) for i in ids]

    def render_chat(self, chat: ChatInput) -> str:
        """The conversation as text, by the tokenizer's chat template (transformers' own renderer, as its
        ``apply_chat_template`` runs it, without tokenizing); 400 when it has none or refuses it."""
        if not self.chat_template:
            raise InvalidRequest(NO_CHAT_TEMPLATE, param="messages")
        if chat.continue_final_message and chat.add_generation_prompt:
            raise InvalidRequest(
                "continue_final_message and add_generation_prompt are not compatible", param="continue_final_message"
            )
        from jinja2 import TemplateError
        from transformers.utils.chat_template_utils import render_jinja_template

        messages = [{k: v for k, v in m.items() if v is not None} for m in chat.messages]  # as transformers drops them
        try:
            rendered, _ = cast(
                tuple[list[str], Any],
                render_jinja_template(  # its annotation says str
                    conversations=[messages],
                    chat_template=self.chat_template,
                    add_generation_prompt=chat.add_generation_prompt,
                    continue_final_message=chat.continue_final_message,
                    **{**self.files.special_tokens, **(chat.chat_template_kwargs or {})},
                ),
            )
        except (TemplateError, ValueError, TypeError) as exc:  # vLLM: 400 for these
            raise InvalidRequest(
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__, param="messages"
            ) from None
        return rendered[0]

    def encode(
        self, texts: list[str], max_tokens: int | None = None, *, add_special_tokens: bool = True, side: str = "right"
    ) -> list[list[int]]:
        """Ids (with special tokens unless told not to); with ``max_tokens``, the tokenizer's own truncation
        (``side="left"``: the last content tokens are kept, between the same special tokens), in one batch call."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        return [e.ids for e in self._encode_batch(texts, max_tokens, add_special_tokens=add_special_tokens, side=side)]
