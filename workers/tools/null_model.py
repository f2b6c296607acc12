"""A model that costs nothing, to measure the gateway alone: word ids in, one constant unit vector out per input.

``poolgate worker --runner-factory poolgate.workers.tools.null_model:load`` serves it
(``poolgate bench --gateway-only`` starts one): the worker's engine, scheduler and
transport run as for a real model, but "tokenizing" is a split on whitespace and
the "forward" writes a fixed vector, so the requests/s measured are the gateway's
(and the transport's) ceiling. Embed only; never a model to serve answers with.
"""
from __future__ import annotations

import zlib

import numpy as np

from poolgate.shared.config import WorkerConfig
from poolgate.shared.rows import Rows
from poolgate.shared.wire import ModelInfo, TextPair
from poolgate.workers.engine.runner_api import Encoded, LoadedModel, RunOutput
from poolgate.workers.engine.sequence import Sequence, param_runs

DIM = 384  # as the bundled MiniLM, so responses weigh what real ones do
VOCAB = 30522
CLS, SEP = 101, 102
MAX_LEN = 512


def _ids(text: str) -> list[int]:
    return [1000 + zlib.crc32(w.encode()) % (VOCAB - 1000) for w in text.split()]


class WordEncoder:
    """Whitespace "tokenizer": one id per word between [CLS] and [SEP]; nothing to decode."""

    tokenizer = None

    def encode(self, texts: list[str], max_tokens: int | None = None, *, add_special_tokens: bool = True,
               side: str = "right") -> list[list[int]]:
        specials = 2 if add_special_tokens else 0
        out = []
        for text in texts:
            ids = _ids(text)
            if max_tokens is not None:
                keep = max(max_tokens - specials, 0)
                ids = ids[len(ids) - keep:] if side == "left" and keep else ids[:keep]
            out.append([CLS, *ids, SEP] if add_special_tokens else ids)
        return out

    def encode_pairs(self, pairs: list[TextPair], max_tokens: int | None = None) -> Encoded:
        ids = [self.encode([f"{p.text} {p.text_pair}"], max_tokens)[0] for p in pairs]
        return Encoded(ids, [None] * len(ids))

    def cut(self, text: str, max_tokens: int) -> str:
        return " ".join(text.split()[:max_tokens]) if max_tokens > 0 else text

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)

    def token_strs(self, ids: list[int]) -> list[str | None]:
        return [None] * len(ids)


class ConstantRunner:
    """Every input's embedding is the same unit vector: no compute, correct shapes and runs."""

    def __init__(self, dim: int = DIM):
        self.vector = np.full(dim, dim ** -0.5, dtype=np.float32)

    def prepare(self, seqs: list[Sequence]) -> list[Sequence]:
        return seqs

    def execute(self, batch: list[Sequence], steps: list | None = None) -> list[RunOutput]:
        return [RunOutput(a, b, Rows(np.tile(self.vector, (b - a, 1)))) for a, b, _ in param_runs(batch)]


def load(cfg: WorkerConfig) -> LoadedModel:
    """The runner factory (``module:function(cfg) -> LoadedModel``)."""
    info = ModelInfo(served_model_name=cfg.served_model_name, architecture="NullModel", tasks=("embed",),
                     max_model_len=cfg.max_model_len or MAX_LEN, embedding_dim=DIM, backend="cpu", dtype="float32",
                     vocab_size=VOCAB)
    return LoadedModel(info=info, encoder=WordEncoder(), runner=ConstantRunner(),
                       max_batch_tokens=cfg.max_batch_tokens or 16384)
