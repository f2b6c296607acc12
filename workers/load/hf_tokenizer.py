"""A model folder's tokenizer read once with transformers, as the ``TokenizerFiles`` the gateway tokenizes with.

transformers resolves what the folder holds (``tokenizer.json``, a GGUF
file's vocabulary, a tokenizer only a slow class describes, converted) to one
fast tokenizer; its backend's JSON, the default chat template and the special
tokens are what ``shared.inputs.tokenizer.TextEncoder`` needs, so the worker
and the gateway tokenize with the same files (``shared.inputs.tokenizer_files``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from poolgate.shared.inputs.pylate_roles import PyLateSettings
from poolgate.shared.inputs.tokenizer import TextEncoder
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles


def read_tokenizer(path: Path, *, gguf_file: str | None = None, trust_remote_code: bool = False) -> Any:
    """transformers' fast tokenizer of the folder (or of its GGUF file); ValueError when it has none."""
    from transformers import AutoTokenizer

    gguf = {"gguf_file": gguf_file} if gguf_file else {}  # the tokenizer stored in a GGUF file (workers.load.gguf)
    # trust_remote_code said, never asked: transformers would prompt on stdin for a config with auto_map
    tokenizer = AutoTokenizer.from_pretrained(str(path), use_fast=True, trust_remote_code=trust_remote_code, **gguf)
    if not tokenizer.is_fast:
        raise ValueError(f"{path} has no fast tokenizer (tokenizer.json)")
    return tokenizer


def files_of(tokenizer: Any, *, do_lower_case: bool = False, score_template: str | None = None,
             roles: PyLateSettings | None = None) -> TokenizerFiles:
    """What tokenizing needs of transformers' ``tokenizer``, with poolgate's own input settings."""
    template = tokenizer.get_chat_template() if tokenizer.chat_template else None
    special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, (str, list))}
    return TokenizerFiles(tokenizer.backend_tokenizer.to_str(), template, special, do_lower_case, score_template, roles)


def load_encoder(path: Path, *, do_lower_case: bool = False, gguf_file: str | None = None,
                 score_template: str | None = None, trust_remote_code: bool = False) -> TextEncoder:
    """The folder's ``TextEncoder`` (tests, tools and a worker's own probes)."""
    tokenizer = read_tokenizer(Path(path), gguf_file=gguf_file, trust_remote_code=trust_remote_code)
    return TextEncoder(files_of(tokenizer, do_lower_case=do_lower_case, score_template=score_template))
