"""Fakes for every seam: a fake runner (no torch), tiny random checkpoints."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from poolgate.shared.errors import PoolgateError
from poolgate.shared.limits import check_length, check_params, truncation_length
from poolgate.shared.wire import ModelInfo, PoolingCall, PoolingResult
from poolgate.workers.sequence import Sequence

CLS, SEP = 101, 102


class FakeRunner:
    """A deterministic runner: whitespace "tokens", vectors from token ids.

    Each word becomes one id; vectors depend only on a sequence's own ids, so
    batched equals single. ``batches`` records every batch it ran.
    """

    def __init__(self, *, name: str = "fake-model", max_model_len: int = 32, dim: int = 8,
                 matryoshka: bool = False):
        self.info = ModelInfo(
            served_model_name=name, architecture="FakeModel", tasks=("embed",),
            max_model_len=max_model_len, embedding_dim=dim, backend="cpu", dtype="float32",
            is_matryoshka=matryoshka,
        )
        self.batches: list[list[Sequence]] = []
        self.max_batch_tokens = 64
        self.entered = threading.Event()  # set when a batch starts running
        self.release = threading.Event()  # clear it to hold batches inside run()
        self.release.set()

    def encode_texts(self, texts: list[str], max_tokens: int | None = None) -> list[list[int]]:
        out = []
        for text in texts:
            ids = [1000 + sum(w.encode()) % 20000 for w in text.split()]
            if max_tokens is not None:
                ids = ids[: max(max_tokens - 2, 0)]
            out.append([CLS, *ids, SEP])
        return out

    def run(self, batch: list[Sequence]) -> list[np.ndarray]:
        self.entered.set()
        assert self.release.wait(5), "batch held for more than 5 s"
        self.batches.append(list(batch))
        return [self.vector(s.token_ids, s.params.dimensions, s.params.use_activation) for s in batch]

    def vector(self, ids: list[int], dimensions: int | None = None, normalize: bool | None = None):
        j = np.arange(1, self.info.embedding_dim + 1, dtype=np.float64)
        v = np.cos(np.outer(np.asarray(ids, dtype=np.float64), j) * 1e-3).sum(axis=0)
        v = v[:dimensions] if dimensions else v
        if normalize is not False:
            v = v / np.linalg.norm(v)
        return v.astype(np.float32)


async def until(predicate, timeout: float = 2.0) -> None:
    """Poll ``predicate`` on the event loop until it holds (fails the test after ``timeout`` s)."""
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.005)


@pytest.fixture
def fake_runner() -> FakeRunner:
    return FakeRunner()


# --- gateway fakes: an in-memory WorkerClient ---------------------------------


class FakeWorkerClient:
    """``shared.transport.WorkerClient`` in memory: a FakeRunner behind the worker's checks.

    Like a real worker it checks params and lengths with ``shared.limits``.
    Set ``fail`` to make every call raise it; set ``gate`` (an asyncio.Event)
    to hold calls until it is set. ``calls`` records every call received.
    """

    def __init__(self, runner: FakeRunner | None = None, *, address: str = "fake://0"):
        self.runner = runner or FakeRunner()
        self.address = address
        self.calls: list[PoolingCall] = []
        self.fail: PoolgateError | None = None
        self.gate: asyncio.Event | None = None
        self.closed = False
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def info(self) -> ModelInfo:
        return self.runner.info

    async def health(self) -> dict:
        if self.fail is not None:
            raise self.fail
        return {"ready": True, "queued": 0, "queued_tokens": 0, "running": self._in_flight}

    async def pool(self, call: PoolingCall) -> PoolingResult:
        self._in_flight += 1
        try:
            self.calls.append(call)
            if self.gate is not None:
                await self.gate.wait()
            if self.fail is not None:
                raise self.fail
            return self._run(call)
        finally:
            self._in_flight -= 1

    def _run(self, call: PoolingCall) -> PoolingResult:
        info = self.runner.info
        check_params(info, call.params)
        keep = truncation_length(info, call.params)
        seqs = []
        for item in call.inputs:
            if isinstance(item, str):
                ids = self.runner.encode_texts([item], keep)[0]
            else:
                ids = list(item) if keep is None else list(item)[:keep]
            check_length(info, len(ids))
            seqs.append(Sequence(ids, call.params))
        outputs = self.runner.run(seqs)
        return PoolingResult(outputs=outputs, prompt_tokens=[s.num_tokens for s in seqs])

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_client(fake_runner: FakeRunner) -> FakeWorkerClient:
    return FakeWorkerClient(fake_runner)


def make_tiny_tokenizer(folder) -> None:
    """A 100-word word-level fast tokenizer ("w0".."w94" plus BERT's specials) saved into ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(folder)


def make_tiny_checkpoint(folder, *, model_type: str = "bert", seed: int = 0, legacy_ln_names: bool = False):
    """A tiny random transformers checkpoint (safetensors) plus a word-level tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModel

    extra = {"pad_token_id": 0} if model_type == "bert" else {"pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}
    config = AutoConfig.for_model(
        model_type, vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64 + (2 if model_type != "bert" else 0), **extra,
    )
    torch.manual_seed(seed)
    model = AutoModel.from_config(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    make_tiny_tokenizer(folder)
    if legacy_ln_names:
        from safetensors.torch import load_file, save_file

        path = f"{folder}/model.safetensors"
        state = load_file(path)
        renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
                   for k, v in state.items()}
        save_file(renamed, path, metadata={"format": "pt"})
    return model


@pytest.fixture
def tiny_bert(tmp_path):
    """(folder, transformers model) of a tiny random BERT."""
    model = make_tiny_checkpoint(tmp_path / "bert")
    return tmp_path / "bert", model
