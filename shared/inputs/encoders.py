"""The encoders a model's ``TokenizerFiles`` can name (their ``kind``), and the one way to build one."""

from __future__ import annotations

from collections.abc import Callable

from poolgate.shared.inputs.encoded import TextEncoder
from poolgate.shared.inputs.tokenizer import TextEncoder as FastTokenizer
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.inputs.words import WordEncoder

ENCODERS: dict[str, Callable[[TokenizerFiles], TextEncoder]] = {
    "tokenizers": FastTokenizer,  # a fast tokenizer's tokenizer.json (every real model)
    "words": WordEncoder,  # whitespace word ids (shared.inputs.words: the zero-cost model)
}


def encoder_for(files: TokenizerFiles) -> TextEncoder:
    """The encoder of ``files``; ValueError naming the kinds there are for one of another kind."""
    make = ENCODERS.get(files.kind)
    if make is None:
        raise ValueError(f"tokenizer files of kind {files.kind!r}: this gateway reads {sorted(ENCODERS)}")
    return make(files)
