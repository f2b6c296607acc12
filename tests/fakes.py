"""Fakes for every seam: encoder, runner and loaded model (no torch), a real worker stack
around them, a pool-level client, and tiny random checkpoints.

The fake runner's outputs depend only on a sequence's own ids, so batched
equals single and a test can compute the expected output with ``fake_output``
(``fake_vector`` for embed, ``fake_probs`` for classify, one of those per token
for the token tasks).
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import zlib

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest, PoolgateError
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows
from poolgate.shared.wire.transport import WorkerClient
from poolgate.shared.wire.messages import ChatInput, ModelInfo, PoolingCall, PoolingResult, TextPair
from poolgate.shared.inputs.encoded import Encoded
from poolgate.shared.inputs.front import Front
from poolgate.shared.inputs.tokenizer_files import TokenizerFiles
from poolgate.shared.inputs.words import WordEncoder
from poolgate.shared.wire.token_call import TokenCall
from poolgate.workers.engine.runner_api import LoadedModel, RunOutput
from poolgate.workers.engine.sequence import Sequence, param_runs

CLS, SEP = 101, 102
FAIL_TOKEN = 666  # a sequence whose first real token is this makes the fake device fail


class FakeEncoder(WordEncoder):
    """The ``words`` tokenizer (each word one id, between CLS and SEP) that records its calls and threads, fails
    on the text "explode", and decodes the words it has seen."""

    def __init__(self, *, chat_template: bool = True) -> None:
        super().__init__()
        self.calls: list[tuple[list[str], int | None]] = []
        self.pair_calls: list[list[TextPair]] = []
        self.threads: set[int] = set()
        self.chat_template = "words" if chat_template else None

    def word_id(self, word: str) -> int:
        return fake_word_id(word)

    def encode_pairs(self, pairs: list[TextPair], max_tokens: int | None = None) -> Encoded:
        self.pair_calls.append(list(pairs))
        return super().encode_pairs(pairs, max_tokens)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        """The words this encoder has seen for ``ids`` ("[CLS]"/"[SEP]" for the specials)."""
        words = [FAKE_VOCAB.get(i, "[UNK]") for i in ids
                 if not (skip_special_tokens and i in (CLS, SEP))]
        return " ".join(words)

    def token_strs(self, ids: list[int]) -> list[str | None]:
        return [FAKE_VOCAB.get(i) for i in ids]

    def render_chat(self, chat: ChatInput) -> str:
        """``fake_chat_text``; a FakeEncoder built with ``chat_template=False`` refuses as the real one does."""
        if not self.chat_template:
            from poolgate.shared.inputs.tokenizer import NO_CHAT_TEMPLATE
            raise InvalidRequest(NO_CHAT_TEMPLATE, param="messages")
        return super().render_chat(chat)

    def encode(self, texts: list[str], max_tokens: int | None = None, *,
               add_special_tokens: bool = True, side: str = "right") -> list[list[int]]:
        self.calls.append((list(texts), max_tokens))
        self.threads.add(threading.get_ident())
        if any(t == "explode" for t in texts):
            raise RuntimeError("tokenizer exploded")
        return super().encode(texts, max_tokens, add_special_tokens=add_special_tokens, side=side)


def fake_chat_text(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The fake chat template: ``<role> content`` per message, ``<assistant>`` to open a reply."""
    text = " ".join(f"<{m['role']}> {m['content']}" for m in messages)
    return f"{text} <assistant>" if add_generation_prompt else text


FAKE_VOCAB: dict[int, str] = {CLS: "[CLS]", SEP: "[SEP]"}  # every word the fake encoder has seen, by id


def fake_word_id(word: str) -> int:
    """A stable id per word (the same in every process); the vocabulary remembers the latest word per id, so a
    rare collision between two tests' words never decodes one test's text as the other's."""
    i = 1000 + zlib.crc32(word.encode()) % 40000
    FAKE_VOCAB[i] = word
    return i


def fake_pair_ids(first: str, second: str) -> tuple[list[int], list[int]]:
    """``[CLS] a [SEP] b [SEP]`` and its token type ids (1 for ``b [SEP]``)."""
    a, b = fake_ids(first), fake_ids(second)[1:]
    return [*a, *b], [0] * len(a) + [1] * len(b)


def fake_front(info: ModelInfo | None = None) -> Front:
    """The gateway side of a fake model: its ``Front`` over a ``FakeEncoder``."""
    return Front(info or fake_model().info, FakeEncoder())


def tokenized(call: PoolingCall, info: ModelInfo | None = None) -> TokenCall:
    """``call`` as the gateway sends it: tokenized by a fake model's ``Front`` (by default one with room for
    any length: a pool's tests are not about the model's input cap)."""
    return fake_front(info or fake_model(max_model_len=10**7).info).prepare(call).call


def fake_ids(text: str, max_tokens: int | None = None) -> list[int]:
    return FakeEncoder().encode([text], max_tokens)[0]


def fake_vector(ids: list[int], dim: int = 8, dimensions: int | None = None,
                normalize: bool | None = None) -> np.ndarray:
    """What FakeRunner returns for ``ids`` under these params."""
    j = np.arange(1, dim + 1, dtype=np.float64)
    v = np.cos(np.outer(np.asarray(ids, dtype=np.float64), j) * 1e-3).sum(axis=0)
    v = v[:dimensions] if dimensions else v
    if normalize is not False:
        v = v / np.linalg.norm(v)
    return v.astype(np.float32)


def expected_vector(text: str, **params) -> np.ndarray:
    return fake_vector(fake_ids(text), **params)


def fake_probs(ids: list[int], num_labels: int = 2, use_activation: bool | None = None) -> np.ndarray:
    """What FakeRunner returns for ``ids`` under classify: softmax of deterministic logits
    (sigmoid when there is one label), or the raw logits when ``use_activation`` is False."""
    j = np.arange(1, num_labels + 1, dtype=np.float64)
    logits = np.sin(np.outer(np.asarray(ids, dtype=np.float64), j) * 1e-2).sum(axis=0)  # (num_labels,)
    if use_activation is False:
        out = logits
    elif num_labels == 1:
        out = 1 / (1 + np.exp(-logits))
    else:
        e = np.exp(logits - logits.max())
        out = e / e.sum()
    return out.astype(np.float32)


# sequence task -> (ids, params, dim, num_labels) -> output; token_X is X of each token alone
FAKE_HEADS = {
    "embed": lambda ids, p, dim, num_labels: fake_vector(ids, dim, p.dimensions, p.use_activation),
    "classify": lambda ids, p, dim, num_labels: fake_probs(ids, num_labels, p.use_activation),
}


def fake_output(ids: list[int], params: PoolingParams, *, dim: int = 8, num_labels: int = 2) -> np.ndarray:
    """FakeRunner's output for one sequence: (dim,) / (num_labels,) or, per token, (T, dim) / (T, num_labels)."""
    task = params.task.removeprefix("token_")
    head = FAKE_HEADS[task]
    if task == params.task:
        return head(ids, params, dim, num_labels)
    return np.stack([head([t], params, dim, num_labels) for t in ids])  # (T, ...)


def expected_output(text: str, task: str = "embed", *, dim: int = 8, num_labels: int = 2, **params) -> np.ndarray:
    """``fake_output`` for ``text`` as the fake encoder tokenizes it."""
    return fake_output(fake_ids(text), PoolingParams(task=task, **params), dim=dim, num_labels=num_labels)


class FakeRunner:
    """The Runner contract in numpy: ``prepare`` records, ``execute`` computes ``fake_vector``.

    Clear ``release`` to hold batches inside ``execute`` (``entered`` is set
    when one arrives). ``batches`` records every executed batch;
    ``prepare_times`` / ``execute_times`` record each stage's (start, end).
    ``execute_delay`` makes every batch take that long on the "device".
    """

    def __init__(self, dim: int = 8, num_labels: int = 2):
        self.dim, self.num_labels = dim, num_labels
        self.batches: list[list[Sequence]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.execute_delay = 0.0
        self.prepare_times: list[tuple[float, float]] = []
        self.execute_times: list[tuple[float, float]] = []

    def prepare(self, seqs: list[Sequence]) -> list[Sequence]:
        start = time.perf_counter()
        batch = list(seqs)
        self.prepare_times.append((start, time.perf_counter()))
        return batch

    def execute(self, batch: list[Sequence], steps: list | None = None) -> list[RunOutput]:
        start = time.perf_counter()
        self.entered.set()
        assert self.release.wait(5), "batch held for more than 5 s"
        if any(s.token_ids[1:2] == [FAIL_TOKEN] for s in batch):
            raise RuntimeError("device fell over")
        if self.execute_delay:
            time.sleep(self.execute_delay)
        forwarded = time.perf_counter()
        self.batches.append(batch)
        outputs = []
        for a, b, p in param_runs(batch):
            items = [fake_output(s.token_ids, p, dim=self.dim, num_labels=self.num_labels) for s in batch[a:b]]
            outputs.append(RunOutput(a, b, _rows(items, token_level=p.task.startswith("token_"))))
        end = time.perf_counter()
        if steps is not None:
            steps += [("forward", start, forwarded), ("pool", forwarded, end)]
        self.execute_times.append((start, end))
        return outputs


def _rows(items: list[np.ndarray], *, token_level: bool) -> Rows:
    """One run's outputs as Rows: stacked, or flat with offsets for a token-level task."""
    if not token_level:
        return Rows(np.stack(items))
    offsets = np.cumsum([0] + [len(x) for x in items]).astype(np.int64)
    return Rows(np.concatenate(items), offsets)


class OutOfMemoryRunner(FakeRunner):
    """A FakeRunner whose "device" holds at most ``max_tokens`` tokens per batch: a bigger batch raises
    ``torch.OutOfMemoryError``, as CUDA's allocator does; ``refused`` records each refused batch's size."""

    def __init__(self, max_tokens: int, dim: int = 8, num_labels: int = 2):
        super().__init__(dim, num_labels)
        self.max_tokens = max_tokens
        self.refused: list[int] = []

    def execute(self, batch: list[Sequence], steps: list | None = None) -> list[RunOutput]:
        tokens = sum(s.num_tokens for s in batch)
        if tokens > self.max_tokens:
            import torch  # only the tests that use this runner need torch

            self.refused.append(len(batch))
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate a batch of {tokens} tokens")
        return super().execute(batch, steps)


class RefusingRunner(FakeRunner):
    """A FakeRunner whose "device" refuses every batch with ``error`` (a PoolgateError the worker sends as
    itself, e.g. ``Overloaded`` with its ``retry_after_s``); ``refused`` counts the refused batches."""

    def __init__(self, error: PoolgateError, dim: int = 8, num_labels: int = 2):
        super().__init__(dim, num_labels)
        self.error = error
        self.refused = 0

    def execute(self, batch: list[Sequence], steps: list | None = None) -> list[RunOutput]:
        self.refused += 1
        raise self.error


def fake_model(*, name: str = "fake-model", max_model_len: int = 32, dim: int = 8, matryoshka: bool = False,
               max_batch_tokens: int = 64, runner: FakeRunner | None = None,
               encoder: FakeEncoder | None = None, tasks: tuple[str, ...] = ("embed",),
               num_labels: int | None = None, labels: tuple[str, ...] | None = None,
               chunked: bool = False, max_embed_len: int | None = None) -> LoadedModel:
    """A fake model serving ``tasks`` (as a worker lists them: the active task first); classify tasks
    have ``num_labels`` outputs (default: as many as ``labels``, else 2), named by ``labels`` (None = no names).
    ``chunked`` / ``max_embed_len``: the pooler config's chunked processing (done by the engine, not the runner)."""
    num_labels = num_labels or (len(labels) if labels else 2)
    info = ModelInfo(served_model_name=name, architecture="FakeModel", tasks=tuple(tasks),
                     max_model_len=max_model_len, embedding_dim=dim, backend="cpu", dtype="float32",
                     is_matryoshka=matryoshka, vocab_size=50_000, labels=labels,
                     chunked_processing=chunked, max_embed_len=max_embed_len)
    return LoadedModel(info=info, encoder=encoder or FakeEncoder(), runner=runner or FakeRunner(dim, num_labels),
                       max_batch_tokens=max_batch_tokens)


@contextlib.asynccontextmanager
async def running_engine(model: LoadedModel, **settings):
    """A started ``Engine`` over ``model`` (no transport) with ``Engine``'s keyword ``settings``; stopped on exit."""
    from poolgate.workers.engine.engine import Engine

    engine = Engine(model, **settings)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


@contextlib.asynccontextmanager
async def running_worker(model: LoadedModel, address: str):
    """A real worker (transport server + Engine) serving ``model`` on ``address``; yields the engine."""
    from poolgate.workers.server import serve

    async with running_engine(model) as engine:
        server = await serve(address, engine, model.info)
        try:
            yield engine
        finally:
            server.close()
            if isinstance(model.runner, FakeRunner):  # let a held fake batch finish (a real runner holds none)
                model.runner.release.set()


@contextlib.asynccontextmanager
async def worker_clients(models: list[LoadedModel], folder):
    """Real workers for ``models`` on Unix sockets in ``folder``, and a connected client for each."""
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for i, model in enumerate(models):
            address = f"unix:{folder}/w{i}.sock"
            await stack.enter_async_context(running_worker(model, address))
            client = await WorkerClient.connect(address)
            stack.push_async_callback(client.close)
            clients.append(client)
        yield clients


class FakeWorkerClient:
    """A pool-level fake of ``WorkerClient`` (for ``WorkerPool`` unit tests only).

    Answers with ``fake_vector`` per input; set ``fail`` to make every call
    raise it, ``gate`` (an asyncio.Event) to hold calls until it is set,
    ``health_gate`` to hold health checks (a hung worker), ``health_answer``
    to change what a health check returns.
    """

    def __init__(self, info: ModelInfo | None = None, *, address: str = "fake://0"):
        self.info_ = info or fake_model().info
        self.address = address
        self.calls: list[PoolingCall] = []
        self.fail: PoolgateError | None = None
        self.gate: asyncio.Event | None = None
        self.health_gate: asyncio.Event | None = None
        self.health_answer: dict = {"ready": True}
        self.closed = False

    async def info(self) -> ModelInfo:
        return self.info_

    async def health(self) -> dict:
        if self.health_gate is not None:
            await self.health_gate.wait()
        if self.fail is not None:
            raise self.fail
        return self.health_answer

    async def tokenizer(self) -> tuple[ModelInfo, TokenizerFiles]:
        return self.info_, FakeEncoder().files

    async def lora(self, action: str, name: str, path: str | None = None) -> None:
        raise InvalidRequest(f"model {self.info_.served_model_name!r} serves no LoRA adapters (--max-loras 0)")

    async def pool(self, call: TokenCall) -> PoolingResult:
        self.calls.append(call)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        ids = call.sequences()
        values = np.stack([fake_vector(x, self.info_.embedding_dim) for x in ids])
        return PoolingResult(outputs=Rows(values), prompt_tokens=[len(x) for x in ids])

    async def close(self) -> None:
        self.closed = True


class FakeDns:
    """A resolver for ``gateway.pools.discovery`` (``resolver(host, port) -> addresses``): answers ``addresses``,
    or raises OSError while ``fail`` is set; records every question in ``asked``."""

    def __init__(self, *addresses: str):
        self.addresses, self.fail, self.asked = list(addresses), False, []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if self.fail:
            raise OSError("Temporary failure in name resolution")
        return list(self.addresses)


async def until(predicate, timeout: float = 2.0) -> None:
    """Poll ``predicate`` on the event loop until it holds (fails the test after ``timeout`` s)."""
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.005)


def make_tiny_tokenizer(folder, *, pair_types: bool = False) -> None:
    """A 100-word word-level fast tokenizer ("w0".."w94" plus BERT's specials) saved into ``folder``;
    ``pair_types``: a pair's second text (and its [SEP]) gets token type 1, as BERT's tokenizer does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1" if pair_types else "[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    names = {"model_input_names": ["input_ids", "token_type_ids", "attention_mask"]} if pair_types else {}
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]", **names).save_pretrained(folder)


def make_tiny_cross_encoder(folder, *, seed: int = 0):
    """A tiny random BertForSequenceClassification with one label (a cross-encoder) and a tokenizer
    that marks a pair's second text with token type 1; returns the transformers model."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.for_model("bert", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, pad_token_id=0, num_labels=1)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    with torch.no_grad():  # segment embeddings far apart, so a lost token type id shows in every score
        model.bert.embeddings.token_type_embeddings.weight.normal_(0, 1.0)
    model.save_pretrained(folder, safe_serialization=True)
    make_tiny_tokenizer(folder, pair_types=True)
    return model


def save_random(folder, auto, config, *, seed: int = 0):
    """``auto.from_config(config)`` with seeded random weights, saved (safetensors) with the tiny tokenizer
    into ``folder``; returns the transformers model (eval mode), the reference to compare against."""
    import torch

    torch.manual_seed(seed)
    model = auto.from_config(config).eval()
    model.save_pretrained(folder, safe_serialization=True)
    make_tiny_tokenizer(folder)
    return model


def make_tiny_checkpoint(folder, *, model_type: str = "bert", seed: int = 0, legacy_ln_names: bool = False):
    """A tiny random transformers checkpoint (safetensors) plus a word-level tokenizer."""
    from transformers import AutoConfig, AutoModel

    extra = {"pad_token_id": 0} if model_type == "bert" else {"pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}
    config = AutoConfig.for_model(
        model_type, vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64 + (2 if model_type != "bert" else 0), **extra,
    )
    model = save_random(folder, AutoModel, config, seed=seed)
    if legacy_ln_names:
        from safetensors.torch import load_file, save_file

        path = f"{folder}/model.safetensors"
        state = load_file(path)
        renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
                   for k, v in state.items()}
        save_file(renamed, path, metadata={"format": "pt"})
    return model
