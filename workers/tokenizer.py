"""Text → token ids with the model's fast tokenizer, truncating as sentence-transformers does."""
from __future__ import annotations

from pathlib import Path

from poolgate.shared.errors import NotSupported


class TextEncoder:
    """Wraps a fast tokenizer; ``do_lower_case`` lower-cases texts first (sentence-transformers)."""

    def __init__(self, path: Path, *, do_lower_case: bool = False):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(path), use_fast=True)
        if not self.tokenizer.is_fast:
            raise ValueError(f"{path} has no fast tokenizer (tokenizer.json)")
        from tokenizers import Tokenizer

        # A private copy: the transformers call below changes its backend's truncation state.
        self.backend = Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
        self.backend.no_truncation()
        self.backend.no_padding()
        self.do_lower_case = do_lower_case

    def encode_pairs(self, firsts: list[str], seconds: list[str], max_tokens: int | None = None) -> list[list[int]]:
        """Each (first, second) as one sequence, the tokenizer's own pair template (``[CLS] a [SEP] b [SEP]``);
        with ``max_tokens``, the longer side is cut first (the tokenizer's ``longest_first``)."""
        if self.do_lower_case:
            firsts, seconds = [t.lower() for t in firsts], [t.lower() for t in seconds]
        kwargs = {"truncation": True, "max_length": max_tokens} if max_tokens is not None else {}
        out = self.tokenizer(firsts, text_pair=seconds, add_special_tokens=True, return_token_type_ids=True, **kwargs)
        if any(any(t) for t in out.get("token_type_ids") or ()):
            raise NotSupported("this tokenizer marks the second text of a pair with token type ids, which "
                               "poolgate's packed encoders do not take yet (BERT-style cross-encoders); "
                               "RoBERTa/XLM-R and decoder rerankers work")
        return out["input_ids"]

    def encode(self, texts: list[str], max_tokens: int | None = None, *,
               add_special_tokens: bool = True) -> list[list[int]]:
        """Ids (with special tokens unless told not to); with ``max_tokens``, tokenizer truncation."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        if max_tokens is None:
            return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
        out = self.tokenizer(texts, add_special_tokens=add_special_tokens, truncation=True, max_length=max_tokens)
        return out["input_ids"]
