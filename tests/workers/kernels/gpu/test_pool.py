"""The Triton segment pooling against its torch references (``workers.kernels.pooling``), in the interpreter.

Row picks (CLS, LAST, kept rows) are copies and must match exactly; a mean
sums in fp32 in another order than ``index_add_``, so it matches within fp32
rounding (rtol 1e-5, atol 1e-6) whatever the input dtype.
"""
import sys

import numpy as np
import pytest
import torch

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.batch.packing import pack
from poolgate.workers.kernels import gpu
from poolgate.workers.kernels import pooling as ref
from poolgate.workers.kernels.gpu import INTERPRET_ENV, normalize, pool
from poolgate.workers.kernels.ops import REFERENCE
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead, RawHead
from poolgate.workers.pooling.rows import all_rows, drop_ends, step_rows

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MEAN_TOL = {"rtol": 1e-5, "atol": 1e-6}
TAG = 7  # the step tag of the STEP-like selections
HIDDEN = 300  # two column blocks of the kernels, the second one masked


def _batch(lengths: list[int], seed: int = 0):
    """A packed batch of ``lengths`` with token ids in 0..9 (so about one token in ten is the tag)."""
    g = torch.Generator().manual_seed(seed)
    return pack([torch.randint(0, 10, (n,), generator=g).tolist() for n in lengths], group_attention=False)


def _hidden(batch, dtype: torch.dtype, width: int = HIDDEN) -> torch.Tensor:
    return torch.randn(batch.n_tokens, width, generator=torch.Generator().manual_seed(1)).to(dtype)


BATCHES = {"one token": [1], "odd lengths": [3, 1, 7, 5, 1], "many": [1 + (i * 7) % 13 for i in range(40)]}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths", BATCHES.values(), ids=BATCHES.keys())
def test_sequence_methods_match_the_references(dtype, lengths):
    batch = _batch(lengths)
    hidden = _hidden(batch, dtype)
    for name in ("CLS", "LAST"):  # picks: exact, in the model's dtype
        got, want = pool.POOLING[name](hidden, batch), ref.POOLING[name](hidden, batch)
        assert got.dtype == want.dtype == dtype and torch.equal(got, want), name
    got, want = pool.POOLING["MEAN"](hidden, batch), ref.POOLING["MEAN"](hidden, batch)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, **MEAN_TOL)
    assert pool.POOLING["ALL"](hidden, batch) is hidden


def test_a_strided_hidden_is_read_by_its_rows():
    batch = _batch([4, 2, 5])
    hidden = _hidden(batch, torch.float16, 2 * HIDDEN)[:, ::2]  # column stride 2: copied first
    torch.testing.assert_close(pool.mean_pool(hidden, batch), ref.mean_pool(hidden, batch), **MEAN_TOL)
    assert torch.equal(pool.last_pool(hidden, batch), ref.last_pool(hidden, batch))


SELECTORS = {"all": all_rows, "step": step_rows(TAG), "drop ends": drop_ends(first=1, last=1),
             "drop first two": drop_ends(first=2)}


def _plan(batch, selector, a: int, b: int):
    """The run a..b's rows, each row's sequence in the run, and the selector's kept-row index (or None)."""
    lo, hi = int(batch.cu_seqlens[a]), int(batch.cu_seqlens[b])
    index, counts = selector(batch.input_ids.numpy()[lo:hi], batch.lengths[a:b])
    seq = batch.seg_ids[lo:hi].long() - a
    return lo, hi, seq, None if index is None else torch.from_numpy(index.astype(np.int64)), counts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("selector", SELECTORS.values(), ids=SELECTORS.keys())
def test_the_kept_row_mean_matches_the_reference(dtype, selector):
    batch = _batch(BATCHES["many"])
    hidden = _hidden(batch, dtype)
    for a, b in [(0, 40), (3, 4), (10, 27)]:  # the whole batch, one sequence, a run in the middle
        lo, hi, seq, index, counts = _plan(batch, selector, a, b)
        got = pool.kept_mean(hidden[lo:hi], seq, index, b - a)
        want = ref.kept_mean(hidden[lo:hi], seq, index, b - a)
        assert got.dtype == torch.float32 and got.shape == (b - a, HIDDEN)
        torch.testing.assert_close(got, want, **MEAN_TOL)
        assert not got[torch.tensor(counts) == 0].any()  # a sequence that keeps nothing: zeros


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("selector", SELECTORS.values(), ids=SELECTORS.keys())
def test_the_kept_rows_are_gathered_in_order_as_fp32(dtype, selector):
    batch = _batch(BATCHES["odd lengths"])
    hidden = _hidden(batch, dtype)
    lo, hi, _, index, counts = _plan(batch, selector, 1, 5)
    got = pool.kept_rows(hidden[lo:hi], index)
    assert got.dtype == torch.float32 and got.shape == (sum(counts), HIDDEN)
    assert torch.equal(got, ref.kept_rows(hidden[lo:hi], index))


def test_keeping_no_row_at_all_gives_empty_and_zero_outputs():
    batch = _batch([1, 2])
    hidden = _hidden(batch, torch.bfloat16)
    none = torch.zeros(0, dtype=torch.int64)
    assert pool.kept_rows(hidden, none).shape == (0, HIDDEN)
    got = pool.kept_mean(hidden, batch.seg_ids.long(), none, 2)
    assert torch.equal(got, ref.kept_mean(hidden, batch.seg_ids.long(), none, 2)) and not got.any()


def _pooler(ops) -> DispatchPooler:
    return DispatchPooler({
        "embed": Pooler("MEAN", EmbedHead(None, True, 24, l2_cut=ops.l2_cut), rows=drop_ends(first=1)),
        "token_embed": Pooler("STEP", EmbedHead(None, True, l2_cut=ops.l2_cut), rows=step_rows(TAG)),
        "classify": Pooler("LAST", RawHead()),
    }, ops=ops)


def _cls_pooler(ops) -> DispatchPooler:
    return DispatchPooler({"embed": Pooler("CLS", EmbedHead(None, False, l2_cut=ops.l2_cut)),
                           "token_embed": Pooler("ALL", EmbedHead(None, True, l2_cut=ops.l2_cut))}, ops=ops)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_whole_pooler_run_with_the_triton_pooling_matches_the_references(dtype):
    batch = _batch([5, 1, 9, 4, 3, 6, 2])
    hidden = _hidden(batch, dtype, 40)
    runs = [(0, 2, PoolingParams(task="embed")), (2, 3, PoolingParams(task="embed", dimensions=8)),
            (3, 5, PoolingParams(task="token_embed")), (5, 6, PoolingParams(task="classify")),
            (6, 7, PoolingParams(task="embed", dimensions=16, use_activation=False))]
    triton_ops = pool.triton_pooling(REFERENCE)
    for make, task_runs in [(_pooler, runs), (_cls_pooler, [(0, 3, PoolingParams(task="embed", dimensions=8)),
                                                            (3, 7, PoolingParams(task="token_embed"))])]:
        want_pooler, got_pooler = make(REFERENCE), make(triton_ops)
        want = want_pooler(hidden, batch, want_pooler.plan(batch, task_runs))
        got = got_pooler(hidden, batch, got_pooler.plan(batch, task_runs))
        assert len(got) == len(want) == len(task_runs)
        for g, w in zip(got, want, strict=True):
            assert g.values.shape == w.values.shape and g.values.dtype == w.values.dtype == torch.float32
            torch.testing.assert_close(g.values, w.values, **MEAN_TOL)
            assert (g.offsets is None and w.offsets is None) or np.array_equal(g.offsets, w.offsets)


def test_triton_pooling_puts_every_pooling_op_into_the_bundle():
    ops = pool.triton_pooling(REFERENCE)
    assert ops.pooling["MEAN"] is pool.mean_pool and ops.kept_mean is pool.kept_mean
    assert ops.kept_rows is pool.kept_rows and ops.l2_cut.__module__.endswith("gpu.normalize")
    assert ops.attention is REFERENCE.attention and set(ops.pooling) == set(REFERENCE.pooling)


def test_cpu_tensors_outside_the_interpreter_take_the_references_without_triton(monkeypatch):
    monkeypatch.delenv(INTERPRET_ENV)
    monkeypatch.delattr(gpu, "pool_jit", raising=False)
    monkeypatch.setitem(sys.modules, "poolgate.workers.kernels.gpu.pool_jit", None)  # a launch would fail to import
    batch = _batch([3, 1, 4])
    hidden = _hidden(batch, torch.bfloat16)
    seq, index = batch.seg_ids.long(), torch.tensor([0, 2, 4, 6])
    for name in ("CLS", "LAST", "MEAN"):
        assert torch.equal(pool.POOLING[name](hidden, batch), ref.POOLING[name](hidden, batch))
    assert torch.equal(pool.kept_mean(hidden, seq, index, 3), ref.kept_mean(hidden, seq, index, 3))
    assert torch.equal(pool.kept_rows(hidden, index), ref.kept_rows(hidden, index))
    assert torch.equal(normalize.l2_cut(hidden.float(), 8, True), ref.l2_cut(hidden.float(), 8, True))
