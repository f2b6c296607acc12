"""Chunked prefill (workers.engine.chunked_prefill): a long causal input run in chunks whose K/V are kept
equals the unchunked forward (cosine >= 0.9999, max abs diff <= 1e-5, fp32) on every decoder family, for
LAST-pooled embeddings and the yes/no reranker's scores; short inputs beside its chunks are unchanged."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import replace

import numpy as np
import pytest
from transformers import AutoModelForCausalLM

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.chunked_prefill import Prefill
from poolgate.workers.engine.sequence import Sequence
from tests.workers.engine.test_prefix_cache import FAMILIES, _close, _load, _run
from tests.workers.models.test_decoder_golden import CASES, save_tiny

LONG = [[2] + [(7 * i + 3 * j) % 90 + 5 for i in range(n)] for j, n in enumerate((110, 101, 123))]
SHORT = [[2, 40 + j, 50 + j, 60, 3] for j in range(3)]


def _chunked(runner, ids: list[int], size: int, params=PoolingParams(), beside=()) -> tuple[np.ndarray, list]:
    """``ids`` run chunk by chunk (one runner batch each, ``beside`` packed around every chunk): the final
    chunk's row, and each batch's rows of the short sequences."""
    pf = Prefill(list(ids), size)
    seq = Sequence(pf.chunk(), params, prefill=pf)
    shorts = []
    while True:
        around = [Sequence(list(b), params) for b in beside]
        batch = around[:1] + [seq] + around[1:]
        outs = runner.execute(runner.prepare(batch))
        rows = np.concatenate([o.rows.values for o in outs])
        at = 1 if beside else 0
        shorts.append(np.delete(rows, at, axis=0))
        if pf.final:
            pf.free()
            return rows[at:at + 1], shorts
        assert pf.kv is not None and pf.kv.dtype == runner.dtype
        seq.token_ids = pf.advance()


@pytest.mark.parametrize("case", FAMILIES)
def test_chunked_embeddings_equal_the_unchunked_forward(tmp_path, case):
    model_type, _, extra = CASES[case]
    save_tiny(tmp_path, model_type, CASES[case][1], **extra)
    runner = _load(tmp_path, max_batch_tokens=32).runner
    assert runner.chunked_prefill is not None
    want = _run(runner, LONG)
    for size in (16, 13):
        got = np.concatenate([_chunked(runner, ids, size)[0] for ids in LONG])
        _close(got, want)


def test_yes_no_reranker_scores_equal_the_unchunked_ones(tmp_path):
    save_tiny(tmp_path, "qwen3", "Qwen3ForCausalLM", auto=AutoModelForCausalLM, head_dim=32)
    model = _load(tmp_path, max_batch_tokens=32, convert="classify",
                  hf_overrides={"classifier_from_token": ["w1", "w2"]})
    runner, params = model.runner, PoolingParams(task="classify")
    want = _run(runner, LONG, params)
    got = np.concatenate([_chunked(runner, ids, 16, params)[0] for ids in LONG])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["qwen3", "llama"])
def test_short_inputs_beside_the_chunks_are_unchanged(tmp_path, case):
    model_type, _, extra = CASES[case]
    save_tiny(tmp_path, model_type, CASES[case][1], **extra)
    runner = _load(tmp_path, max_batch_tokens=32, prefix_cache_mb=4).runner  # the cache stays out of chunk batches
    want_long, want_short = _run(runner, LONG[:1]), _run(runner, SHORT)
    got, shorts = _chunked(runner, LONG[0], 16, beside=SHORT)
    _close(got, want_long)
    for rows in shorts:
        _close(rows, want_short)


def test_through_the_engine_a_long_input_runs_in_chunks_beside_short_ones(tmp_path):
    from poolgate.workers.offline import PoolingModel

    save_tiny(tmp_path, "qwen3", "Qwen3Model", head_dim=32)
    long = " ".join(f"w{(7 * i) % 90}" for i in range(110))
    texts = ["w5 w6 w7", long, "w8 w9", long[:200]]  # rows come back in input order
    with PoolingModel(str(tmp_path), dtype="float32", max_batch_tokens=1024) as plain:
        want = plain.embed(texts)
    with PoolingModel(str(tmp_path), dtype="float32", max_batch_tokens=32, embedding_cache_mb=4) as chunked:
        before = chunked._engine.stats.batches
        for _ in range(2):  # the second time through the embedding cache, which never keeps a chunk's row
            _close(chunked.embed(texts), want)
        assert chunked._engine.stats.batches - before >= 2 * (112 // 16)  # one chunk of 16 tokens per batch
        assert chunked._engine.scheduler.queued == 0


class _Gate:
    """A runner that holds its ``at``-th execute until ``go`` is set."""

    def __init__(self, runner, at: int):
        self.runner, self.at, self.count = runner, at, 0
        self.chunked_prefill, self.prefix_cache = runner.chunked_prefill, runner.prefix_cache
        self.reached, self.go = threading.Event(), threading.Event()

    def prepare(self, seqs):
        return self.runner.prepare(seqs)

    def execute(self, batch, steps=None):
        self.count += 1
        if self.count == self.at:
            self.reached.set()
            self.go.wait(10)
        return self.runner.execute(batch, steps)


def test_cancelling_mid_input_drops_its_remaining_chunks_and_frees_its_store(tmp_path):
    from poolgate.shared.wire.token_call import TokenCall
    from poolgate.workers.engine.engine import Engine

    save_tiny(tmp_path, "qwen3", "Qwen3Model", head_dim=32)
    model = _load(tmp_path, max_batch_tokens=32)
    gate = _Gate(model.runner, at=3)
    engine = Engine(replace(model, runner=gate))
    ids = LONG[0]

    async def go():
        await engine.start()
        call = TokenCall("r", "t", np.asarray(ids, np.int32), np.asarray([0, len(ids)], np.int64))
        task = asyncio.create_task(engine.submit_tokens(call))
        assert await asyncio.to_thread(gate.reached.wait, 10)
        seq = next(iter(engine._live)).seqs[0]
        assert seq.prefill.start == 32 and seq.prefill.nbytes > 0  # two chunks kept, the third running
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert seq.cancelled and seq.prefill.kv is None
        gate.go.set()
        await asyncio.sleep(0.5)
        assert gate.count == 3 and seq.prefill.kv is None and engine.scheduler.queued == 0
        await engine.stop()

    asyncio.run(go())


def test_all_pooled_token_embeddings_join_every_chunks_rows_in_order(tmp_path):
    from poolgate.workers.offline import PoolingModel

    save_tiny(tmp_path, "llama", "LlamaModel")
    long = " ".join(f"w{(5 * i) % 90}" for i in range(100))
    texts = [long, "w5 w6 w7", long[:150]]
    with PoolingModel(str(tmp_path), dtype="float32", max_batch_tokens=1024) as plain:
        want = plain.encode(texts, pooling_task="token_embed")
    with PoolingModel(str(tmp_path), dtype="float32", max_batch_tokens=32) as chunked:
        before = chunked._engine.stats.batches
        got = chunked.encode(texts, pooling_task="token_embed")
        assert chunked._engine.stats.batches - before >= 102 // 16 and chunked._engine.scheduler.queued == 0
    assert [g.shape for g in got] == [w.shape for w in want] and got[0].shape[0] == 102
    for g, w in zip(got, want):
        _close(g, w)


def test_a_next_chunk_is_queued_past_the_bound_and_refused_only_when_closed():
    from poolgate.shared.domain.errors import Overloaded, Unavailable
    from poolgate.workers.engine.scheduler import TokenBudgetScheduler

    sched = TokenBudgetScheduler(32, max_queued_tokens=40)
    sched.add_all([Sequence([1] * 30, PoolingParams())])
    with pytest.raises(Overloaded):
        sched.add_all([Sequence([1] * 16, PoolingParams())])
    sched.requeue([Sequence([1] * 16, PoolingParams())])  # already admitted: never refused for room
    assert sched.queued_tokens == 46
    sched.close()
    with pytest.raises(Unavailable):
        sched.requeue([Sequence([1] * 16, PoolingParams())])


def test_a_deadline_that_passes_mid_input_drops_its_remaining_chunks(tmp_path):
    import time

    from poolgate.shared.domain.errors import DeadlineExceeded
    from poolgate.shared.wire.token_call import TokenCall
    from poolgate.workers.engine.engine import Engine

    save_tiny(tmp_path, "qwen3", "Qwen3Model", head_dim=32)
    model = _load(tmp_path, max_batch_tokens=32)
    gate = _Gate(model.runner, at=2)
    engine = Engine(replace(model, runner=gate))
    ids = LONG[1]

    async def go():
        await engine.start()
        call = TokenCall("r", "t", np.asarray(ids, np.int32), np.asarray([0, len(ids)], np.int64),
                         deadline=time.time() + 1.0)
        task = asyncio.create_task(engine.submit_tokens(call))
        assert await asyncio.to_thread(gate.reached.wait, 10)
        seq = next(iter(engine._live)).seqs[0]
        await asyncio.sleep(1.2)  # the deadline passes while the second chunk runs
        gate.go.set()
        with pytest.raises(DeadlineExceeded):
            await task
        assert seq.prefill.kv is None and gate.count == 2 and engine.scheduler.queued == 0
        await engine.stop()

    asyncio.run(go())
