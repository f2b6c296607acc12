"""A model that costs nothing, to measure the gateway alone: token ids in, one constant unit vector out per input.

``poolgate worker MODEL --runner-factory poolgate.workers.tools.null_model:load`` serves it
(``poolgate bench --gateway-only`` starts one): the worker's engine, scheduler and
transport run as for a real model, but the "forward" writes a fixed vector, so the
requests/s measured are the gateway's (and the transport's) ceiling. ``load``
gives the gateway MODEL's own tokenizer (the bundled MiniLM's by default), so its
tokenizing is measured with the rest; ``load_words`` the ``words`` tokenizer
(``shared.inputs.words``: a whitespace split), so it is not. Embed only; never a
model to serve answers with.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.wire.rows import Rows
from poolgate.shared.inputs.encoded import TextEncoder
from poolgate.shared.inputs.words import WordEncoder, WordSettings
from poolgate.shared.wire.messages import ModelInfo
from poolgate.workers.engine.runner_api import LoadedModel, RunOutput
from poolgate.workers.engine.sequence import Sequence, param_runs
from poolgate.workers.load.hf_tokenizer import load_encoder

DIM = 384  # as the bundled MiniLM, so responses weigh what real ones do
VOCAB = 30522
MAX_LEN = 512


class ConstantRunner:
    """Every input's embedding is the same unit vector: no compute, correct shapes and runs."""

    def __init__(self, dim: int = DIM):
        self.vector = np.full(dim, dim ** -0.5, dtype=np.float32)

    def prepare(self, seqs: list[Sequence]) -> list[Sequence]:
        return seqs

    def execute(self, batch: list[Sequence], steps: list | None = None) -> list[RunOutput]:
        return [RunOutput(a, b, Rows(np.tile(self.vector, (b - a, 1)))) for a, b, _ in param_runs(batch)]


def load(cfg: WorkerConfig) -> LoadedModel:
    """The runner factory (``module:function(cfg) -> LoadedModel``), with the model folder's tokenizer."""
    return _loaded(cfg, load_encoder(Path(cfg.model)))


def load_words(cfg: WorkerConfig) -> LoadedModel:
    """The runner factory with the ``words`` tokenizer (no tokenizing cost in the gateway)."""
    return _loaded(cfg, WordEncoder(WordSettings(buckets=VOCAB - 1000).files()))


def _loaded(cfg: WorkerConfig, encoder: TextEncoder) -> LoadedModel:
    info = ModelInfo(served_model_name=cfg.served_model_name, architecture="NullModel", tasks=("embed",),
                     max_model_len=cfg.max_model_len or MAX_LEN, embedding_dim=DIM, backend="cpu", dtype="float32",
                     vocab_size=VOCAB, tokenizer_sha256=encoder.files.sha256)
    return LoadedModel(info=info, encoder=encoder, runner=ConstantRunner(),
                       max_batch_tokens=cfg.max_batch_tokens or 16384)
