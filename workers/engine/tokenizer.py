"""Text → token ids with the model's fast tokenizer, truncating as sentence-transformers does; pairs, chat templates, decoding."""
from __future__ import annotations

import threading
from pathlib import Path

from poolgate.shared.errors import InvalidRequest
from poolgate.shared.wire import ChatInput, TextPair
from poolgate.workers.engine.runner_api import Encoded
from poolgate.workers.engine.score_templates import SCORE_TEMPLATES


# vLLM's message when the tokenizer has no chat template (transformers dropped the default one in 4.44).
NO_CHAT_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so you must "
                    "provide a chat template if the tokenizer does not define one.")


class TextEncoder:
    """Wraps a fast tokenizer; ``do_lower_case`` lower-cases texts first (sentence-transformers)."""

    def __init__(self, path: Path, *, do_lower_case: bool = False, gguf_file: str | None = None,
                 score_template: str | None = None, trust_remote_code: bool = False):
        from transformers import AutoTokenizer

        gguf = {"gguf_file": gguf_file} if gguf_file else {}  # the tokenizer stored in a GGUF file (workers.load.gguf)
        # trust_remote_code said, never asked: transformers would prompt on stdin for a config with auto_map
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), use_fast=True, trust_remote_code=trust_remote_code,
                                                       **gguf)
        if not self.tokenizer.is_fast:
            raise ValueError(f"{path} has no fast tokenizer (tokenizer.json)")
        from tokenizers import Tokenizer

        # A private copy: the transformers call below changes its backend's truncation state.
        self.backend = Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
        self.backend.no_truncation()
        self.backend.no_padding()
        # transformers' call sets its backend's truncation before each call: one caller at a time when the
        # engine tokenizes on several threads (the private backend above has no such state and runs at once)
        self._stateful = threading.Lock()
        self.do_lower_case = do_lower_case
        self.roles = None  # a PyLate model's RoleEncoder (workers.engine.roles), set where the model is built
        self.score_template = SCORE_TEMPLATES[score_template] if score_template else None  # workers.engine.score_templates

    def encode_pairs(self, pairs: list[TextPair], max_tokens: int | None = None) -> Encoded:
        """Each pair as one sequence in the tokenizer's pair template (``[CLS] a [SEP] b [SEP]``), with its
        token type ids (BERT marks the second text 1). Each side is first cut to its own content-token cap
        (``TextPair.max_*_tokens``, at a character boundary, as vLLM does); with ``max_tokens``, the
        longer side is then cut first (the tokenizer's ``longest_first``). A model with a score template
        (``workers.engine.score_templates``) reads each pair as that prompt instead, with no token type ids."""
        firsts = [self.cut(p.text, p.max_text_tokens) for p in pairs]
        seconds = [self.cut(p.text_pair, p.max_pair_tokens) for p in pairs]
        if self.do_lower_case:
            firsts, seconds = [t.lower() for t in firsts], [t.lower() for t in seconds]
        if self.score_template is not None:  # an LLM reranker's prompt, tokenized whole
            return Encoded([self._template_ids(a, b, p.instruction, max_tokens)
                            for a, b, p in zip(firsts, seconds, pairs)], [None] * len(pairs))
        if max_tokens is not None and max_tokens < self.tokenizer.num_special_tokens_to_add(pair=True) + 2:
            raise InvalidRequest(f"truncate_prompt_tokens={max_tokens} cannot hold a pair: its special tokens "
                                 "and at least one token of each text", param="truncate_prompt_tokens")
        kwargs = {"truncation": True, "max_length": max_tokens} if max_tokens is not None else {}
        out = self._call(firsts, text_pair=seconds, add_special_tokens=True, return_token_type_ids=True, **kwargs)
        types = out.get("token_type_ids") or [None] * len(pairs)
        return Encoded(out["input_ids"], [t if t is not None and any(t) else None for t in types])

    def _call(self, *args, **kwargs):
        """The transformers tokenizer's call, serialized (it changes its truncation state)."""
        with self._stateful:
            return self.tokenizer(*args, **kwargs)

    def _template_ids(self, query: str, document: str, instruction: str | None, max_tokens: int | None) -> list[int]:
        """The score template's prompt as ids; with ``max_tokens``, the document is cut until the prompt fits
        (the template's own tokens, which the score is read after, are never cut)."""
        for _ in range(3):  # a cut can merge differently at its edge: measure again
            ids = self._call(self.score_template(query, document, instruction), add_special_tokens=True)["input_ids"]
            if max_tokens is None or len(ids) <= max_tokens:
                return ids
            doc_tokens = len(self.backend.encode(document, add_special_tokens=False).ids)
            keep = doc_tokens - (len(ids) - max_tokens)
            if keep <= 0:
                break
            document = self.cut(document, keep)
        raise InvalidRequest(f"truncate_prompt_tokens={max_tokens} cannot hold this reranker's prompt: its "
                             "template, the query and at least one token of the document", param="truncate_prompt_tokens")

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
        return seen[:encoding.offsets[max_tokens - 1][1]]

    def token_spans(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        """The text the tokenizer sees (lower-cased first where the model lower-cases) and each content
        token's character span in it (the windows of a long document: ``workers.engine.windows``)."""
        seen = text.lower() if self.do_lower_case else text
        return seen, [tuple(o) for o in self.backend.encode(seen, add_special_tokens=False).offsets]

    def room(self, query: str | None, instruction: str | None, max_query_tokens: int) -> int:
        """The tokens a document window shares its sequence with: the special tokens and the query (cut to
        ``max_query_tokens``), or with a score template its whole prompt around an empty document."""
        if query is None:
            return self.backend.num_special_tokens_to_add(False)
        query = self.cut(query, max_query_tokens)
        query = query.lower() if self.do_lower_case else query
        if self.score_template is not None:
            return len(self._call(self.score_template(query, "", instruction), add_special_tokens=True)["input_ids"])
        return self.backend.num_special_tokens_to_add(True) + len(self.backend.encode(query, add_special_tokens=False).ids)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (the tokenizer's own decoding)."""
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_strs(self, ids: list[int]) -> list[str | None]:
        """Each id's token string in the vocabulary (None for an id it does not have)."""
        return [self.backend.id_to_token(i) for i in ids]

    def render_chat(self, chat: ChatInput) -> str:
        """The conversation as text, by the tokenizer's chat template; 400 when it has none or refuses it."""
        if not self.tokenizer.chat_template:
            raise InvalidRequest(NO_CHAT_TEMPLATE, param="messages")
        from jinja2 import TemplateError

        try:
            return self.tokenizer.apply_chat_template(
                chat.messages, tokenize=False, add_generation_prompt=chat.add_generation_prompt,
                continue_final_message=chat.continue_final_message, **(chat.chat_template_kwargs or {}))
        except (TemplateError, ValueError, TypeError) as exc:  # vLLM: 400 for these
            raise InvalidRequest(str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                                 param="messages") from None

    def encode(self, texts: list[str], max_tokens: int | None = None, *,
               add_special_tokens: bool = True, side: str = "right") -> list[list[int]]:
        """Ids (with special tokens unless told not to); with ``max_tokens``, tokenizer truncation
        (``side="left"``: the last content tokens are kept, between the same special tokens)."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        if max_tokens is not None and side == "left":
            return [self._encode_left(t, max_tokens, add_special_tokens) for t in texts]
        if max_tokens is None:
            return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
        out = self._call(texts, add_special_tokens=add_special_tokens, truncation=True, max_length=max_tokens)
        return out["input_ids"]

    def _encode_left(self, text: str, max_tokens: int, add_special_tokens: bool) -> list[int]:
        """``text`` cut from the left to fit ``max_tokens`` with its special tokens, then post-processed."""
        specials = self.backend.num_special_tokens_to_add(False) if add_special_tokens else 0
        encoding = self.backend.encode(text, add_special_tokens=False)
        encoding.truncate(max(max_tokens - specials, 0), direction="left")
        return self.backend.post_process(encoding, add_special_tokens=add_special_tokens).ids
