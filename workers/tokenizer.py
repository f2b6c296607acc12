"""Text → token ids with the model's fast tokenizer, truncating as sentence-transformers does."""
from __future__ import annotations

from pathlib import Path


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

    def encode(self, texts: list[str], max_tokens: int | None = None, *,
               add_special_tokens: bool = True) -> list[list[int]]:
        """Ids (with special tokens unless told not to); with ``max_tokens``, tokenizer truncation."""
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        if max_tokens is None:
            return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
        out = self.tokenizer(texts, add_special_tokens=add_special_tokens, truncation=True, max_length=max_tokens)
        return out["input_ids"]
