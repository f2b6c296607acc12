"""A PyLate ColBERT folder's encode settings, read from ``config_sentence_transformers.json`` as PyLate reads them.

PyLate (``pylate.models.ColBERT``) keeps what is not in its modules in that
file: the query and document marker tokens (``query_prefix`` /
``document_prefix``, default ``"[Q] "`` / ``"[D] "``, inserted after the first
token), ``query_length`` (32) and ``document_length`` (180) in tokens with the
marker, ``do_query_expansion`` (True: queries padded to ``query_length`` with
the tokenizer's [MASK], else EOS), ``attend_to_expansion_tokens`` (False: no
token attends the expansion) and ``skiplist_words`` (``string.punctuation``:
tokens dropped from document vectors, each word mapped by
``convert_tokens_to_ids`` as PyLate does, so a word the vocabulary lacks drops
the unknown token). A folder is PyLate's when that file says
``model_type: "ColBERT"`` or sets any of those keys. Its max_model_len (unless set) covers those
lengths, which PyLate encodes past the folder's ``max_seq_length`` (``workers.load.st_config``).

Refused at start-up, by name: a marker its tokenizer does not have (PyLate
would add it with a random embedding), an empty or shared marker (poolgate
tells a document's vectors by its marker, ``workers.pooling.pylate``), no
expansion token, and a Dense with ``use_residual``.
"""
from __future__ import annotations

import json
import string
from pathlib import Path

from poolgate.shared.inputs.pylate_roles import PyLateSettings
from poolgate.workers.load.st_config import PYLATE_KEYS, PYLATE_LENGTHS, ModelSpec

CONFIG = "config_sentence_transformers.json"
DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", **PYLATE_LENGTHS, "do_query_expansion": True,
            "attend_to_expansion_tokens": False}


def pylate_config(spec: ModelSpec) -> dict | None:
    """The folder's config_sentence_transformers.json when it is a PyLate folder, else None."""
    path = spec.path / CONFIG
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text())
    if cfg.get("model_type") != "ColBERT" and not any(k in cfg for k in PYLATE_KEYS):
        return None
    return cfg


def read_settings(spec: ModelSpec, tokenizer) -> PyLateSettings:
    """The folder's settings resolved against ``tokenizer`` (transformers'); ValueError naming what is wrong."""
    cfg = pylate_config(spec) or {}
    where = spec.path / CONFIG
    get = {k: (cfg[k] if cfg.get(k) is not None else v) for k, v in DEFAULTS.items()}
    ids = {}
    for key in ("query_prefix", "document_prefix"):
        token = get[key]
        ids[key] = tokenizer.convert_tokens_to_ids(token) if token else None
        if not token or ids[key] is None or (ids[key] == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise ValueError(f"{where}: {key} {token!r} is not a token of the folder's tokenizer; poolgate "
                             "serves PyLate folders whose markers were saved with them")
    if ids["query_prefix"] == ids["document_prefix"]:
        raise ValueError(f"{where}: query_prefix and document_prefix are the same token; poolgate tells "
                         "queries from documents by their marker")
    expansion = next((t for t in (tokenizer.mask_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
                      if t is not None), None)
    if expansion is None:
        raise ValueError(f"{where}: the tokenizer has no [MASK], EOS or pad token to expand queries with")
    words = cfg.get("skiplist_words")
    words = list(string.punctuation) if words is None else words
    expand = bool(get["do_query_expansion"])
    _check_dense(spec)
    return PyLateSettings(
        query_id=int(ids["query_prefix"]), document_id=int(ids["document_prefix"]),
        query_length=int(get["query_length"]), document_length=int(get["document_length"]),
        expand=expand, attend_expansion=expand and bool(get["attend_to_expansion_tokens"]),
        expansion_id=int(expansion), skiplist=frozenset(int(tokenizer.convert_tokens_to_ids(w)) for w in words))


def _check_dense(spec: ModelSpec) -> None:
    for dense in spec.dense:
        cfg = json.loads((Path(dense.path) / "config.json").read_text())
        if cfg.get("use_residual"):
            raise ValueError(f"{dense.path / 'config.json'}: PyLate's Dense use_residual is not supported")
