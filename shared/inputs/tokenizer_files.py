"""A model's tokenizer as files the gateway can load without transformers or torch, with their content hash.

A worker reads its model folder's tokenizer once, with transformers (which
also resolves a GGUF file's tokenizer and a tokenizer that only a slow class
describes), and reduces it to what tokenizing needs: the fast tokenizer's
``tokenizer.json`` (normalizer, pre-tokenizer, model, post-processor, added
tokens), the chat template, the special tokens by name, and poolgate's own
input settings (lower-casing as sentence-transformers does, a reranker's score
template, a PyLate model's markers and lengths). The ``info`` op hands these to
the gateway (``shared.wire.transport.WorkerClient.tokenizer``), which tokenizes with
them (``shared.inputs.tokenizer.TextEncoder``): the files are the same for a
local worker (its model folder) and a remote one. ``sha256`` is over all of
it: two replicas of one model whose hashes differ would tokenize differently,
and the gateway refuses to put them behind one model name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from poolgate.shared.inputs.pylate_roles import PyLateSettings


@dataclass(frozen=True)
class TokenizerFiles:
    """What tokenizing one model's inputs needs (module doc); ``tokenizer_json`` is the fast tokenizer's file."""

    tokenizer_json: str
    chat_template: str | None = None
    special_tokens: dict[str, Any] = field(default_factory=dict)  # name -> token (bos_token, eos_token, ...)
    do_lower_case: bool = False
    score_template: str | None = None  # a name in shared.inputs.score_templates.SCORE_TEMPLATES
    roles: PyLateSettings | None = None  # a PyLate model's query/document settings
    kind: str = "tokenizers"  # which encoder reads them: a key of shared.inputs.encoders.ENCODERS
    media: dict[str, Any] | None = None  # a media model's plan and processor settings (shared.inputs.media)

    @property
    def sha256(self) -> str:
        """The content hash of everything above (module doc)."""
        digest = hashlib.sha256(self.tokenizer_json.encode())
        digest.update(json.dumps(self._settings(), sort_keys=True).encode())
        return digest.hexdigest()

    def _settings(self) -> dict[str, Any]:
        settings = asdict(self)
        settings.pop("tokenizer_json")
        settings["roles"] = None if self.roles is None else self.roles.to_wire()
        return settings

    def to_wire(self) -> tuple[dict[str, Any], np.ndarray]:
        """The settings as a header, and the tokenizer file's UTF-8 bytes as one array (never a JSON string)."""
        return {**self._settings(), "sha256": self.sha256}, np.frombuffer(self.tokenizer_json.encode(), np.uint8)

    @classmethod
    def from_wire(cls, header: dict[str, Any], data: np.ndarray) -> TokenizerFiles:
        """Inverse of ``to_wire``; ValueError when the files do not hash to the sha256 sent with them."""
        body = {k: v for k, v in header.items() if k != "sha256"}
        roles = body.pop("roles", None)
        files = cls(
            tokenizer_json=data.tobytes().decode(),
            roles=None if roles is None else PyLateSettings.from_wire(roles),
            **body,
        )
        if header.get("sha256") not in (None, files.sha256):
            raise ValueError(f"the tokenizer files do not match their sha256 {header['sha256']}")
        return files
