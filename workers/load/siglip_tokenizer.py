"""SigLIP's SentencePiece-only tokenizer (``spiece.model``) as a fast tokenizer, encoding as ``SiglipTokenizer`` does.

Google's SigLIP (v1) checkpoints ship no ``tokenizer.json``: transformers reads
them with its slow ``SiglipTokenizer`` (the SentencePiece library) and has no
fast version, but the gateway tokenizes with fast tokenizers only. This
builds one from the model file with the protobuf reader transformers ships,
and the steps ``SiglipTokenizer`` takes, in its order: a ``▁`` before the
text, the big_vision canonicalization (lower-cased when ``do_lower_case``,
ASCII punctuation removed, whitespace runs to one space, stripped), then the
model's own SentencePiece normalization (its precompiled character map,
trailing and repeated spaces removed: the slow tokenizer encodes behind an
``<unk>`` it cuts off again, so a leading space stays a word boundary, and
spaces escaped as ``▁``), the Unigram pieces, and ``</s>`` at the end.
Equal to ``SiglipTokenizer`` on every text of ``tests/workers/media/test_siglip_tokenizer.py``.
"""
from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Any

MODEL_FILE = "spiece.model"
EOS, UNK = "</s>", "<unk>"


def siglip_tokenizer(path: Path) -> Any | None:
    """The folder's SigLIP tokenizer as transformers' fast tokenizer, None when the folder has another kind."""
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if (path / "tokenizer.json").is_file() or not (path / MODEL_FILE).is_file():
        return None
    if config.get("tokenizer_class") != "SiglipTokenizer":
        return None
    from transformers import PreTrainedTokenizerFast

    backend = _backend(path / MODEL_FILE, lower=bool(config.get("do_lower_case", True)))
    pad = _content(config.get("pad_token"), EOS)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=_content(config.get("eos_token"), EOS),
                                   unk_token=_content(config.get("unk_token"), UNK), pad_token=pad,
                                   model_max_length=int(config.get("model_max_length") or 64))


def _content(token: Any, default: str) -> str:
    if isinstance(token, dict):
        return str(token.get("content") or default)
    return str(token or default)


def _backend(model_file: Path, *, lower: bool) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import Unigram
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    if proto.trainer_spec.model_type != 1:
        raise ValueError(f"{model_file}: a SigLIP tokenizer is a Unigram model, this one is of type "
                         f"{proto.trainer_spec.model_type}")
    vocab = [(piece.piece, piece.score) for piece in proto.pieces]
    tokenizer = Tokenizer(Unigram(vocab, unk_id=proto.trainer_spec.unk_id, byte_fallback=False))
    spec = proto.normalizer_spec
    steps = [normalizers.Prepend("▁"), *([normalizers.Lowercase()] if lower else []),
             normalizers.Replace(Regex("[" + re.escape(string.punctuation) + "]"), ""),
             normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:  # behind the slow tokenizer's <unk>: leading spaces are not at the start
        steps += [normalizers.Replace(Regex(" +\\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "▁"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    eos = next((i for i, piece in enumerate(proto.pieces) if piece.piece == EOS), None)
    if eos is None:
        raise ValueError(f"{model_file}: no {EOS} piece, which a SigLIP text ends with")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos)])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(),
                                           decoders.Strip(content=" ", left=1)])
    return tokenizer
