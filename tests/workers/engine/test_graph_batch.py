"""CUDA graphs' fixed shapes on the CPU: buckets, the padded batch's layout, and exact pooling through it."""
import pytest

from poolgate.workers.engine.graph_batch import GraphShape, bucket_of, graph_batch, graph_shape, token_buckets
from poolgate.workers.batch.packing import pack


def test_buckets_are_few_and_waste_at_most_a_quarter():
    buckets = token_buckets(32768)
    assert buckets[0] == 16 and buckets[-1] == 32768 and len(buckets) < 40 and list(buckets) == sorted(set(buckets))
    for n in range(1, 32769, 7):
        b = bucket_of(n, buckets)
        assert n <= b <= max(16, n * 1.25 + 16)
    assert bucket_of(32769, buckets) is None and bucket_of(16, buckets) == 16
    assert token_buckets(10) == (10,)
    with pytest.raises(ValueError):
        token_buckets(100, step=1.0)


def test_the_padded_batch_makes_dummy_and_empty_sequences():
    b = pack([[5, 6, 7], [8, 9]], token_types=[[0, 0, 1], None], group_attention=False)
    shape = graph_shape(b, 48, longest=512)
    assert shape == GraphShape(rows=48, seqs=8, max_len=16, types=True)  # 2 real + 3 dummies (16, 16, 11 rows)
    g = graph_batch(b, shape)
    assert g.n_tokens == 48 and g.input_ids[:5].tolist() == [5, 6, 7, 8, 9] and not g.input_ids[5:].any()
    assert g.cu_seqlens.tolist() == [0, 3, 5, 21, 37, 48, 48, 48, 48] and g.lengths == [3, 2, 16, 16, 11, 0, 0, 0]
    assert g.token_type_ids.tolist() == [0, 0, 1] + [0] * 45 and g.groups is None
    assert graph_batch(b, graph_shape(b, 5, longest=512)).cu_seqlens.tolist() == [0, 3, 5]  # no rows to add


def test_shapes_fill_sequences_with_empty_ones():
    b = pack([[1] * 20, [2] * 3, [3] * 5], group_attention=True)
    shape = graph_shape(b, 64, longest=512)
    assert (shape.rows, shape.max_len, shape.seqs) == (64, 32, 8)  # 3 real + 2 dummies (32 + 4 rows) -> 8
    g = graph_batch(b, shape)
    assert g.lengths == [20, 3, 5, 32, 4, 0, 0, 0] and g.cu_seqlens.tolist() == [0, 20, 23, 28, 60, 64, 64, 64, 64]
    assert g.positions[28:].tolist() == list(range(32)) + list(range(4))
    assert g.seg_ids[28:].tolist() == [3] * 32 + [4] * 4 and g.max_len == 32
    assert len(g.groups) == len(b.groups) + 1 and sorted(g.groups[-1].dst.tolist()) == list(range(28, 64))
    assert graph_shape(b, 64, longest=24).max_len == 24  # the dummies' positions stay inside the model's range
    with pytest.raises(ValueError, match="does not fit"):
        graph_batch(b, GraphShape(64, 4, 32))


@pytest.fixture(scope="module")
def minilm():
    from poolgate.shared.config.frozen import WorkerConfig
    from poolgate.shared.config.models import bundled_model_path
    from poolgate.shared.domain.params import PoolingParams
    from poolgate.workers.engine.sequence import Sequence
    from poolgate.workers.load.build import load_model

    model = load_model(WorkerConfig(model=str(bundled_model_path()), served_model_name="m", backend="cpu",
                                    dtype="float32", num_threads=1))
    ids = model.encoder.encode(["a", "Hello world!", "The quick brown fox " * 9, "two words", "x y z"])
    return model, [Sequence(s, PoolingParams(task="embed" if i != 2 else "token_embed")) for i, s in enumerate(ids)]


def test_a_graph_padded_batch_pools_what_the_exact_batch_pools(minilm):
    """The padded batch through the real model on the CPU: the real sequences' pooled outputs are unchanged."""
    import numpy as np
    import torch

    from poolgate.workers.engine.sequence import param_runs

    model, seqs = minilm
    runner = model.runner
    for grouped in (True, False):  # the CPU's grouped SDPA and the plain packed path
        packed = pack([s.token_ids for s in seqs], group_attention=grouped)
        runs = runner.pooler.plan(packed, param_runs(seqs))
        shape = graph_shape(packed, 128, longest=model.info.max_model_len)
        padded = graph_batch(packed, shape)
        assert padded.n_tokens == 128 and len(padded.lengths) == shape.seqs
        with torch.inference_mode():
            exact = runner.pooler(runner.model(packed), packed, runs)
            hidden = runner.model(padded)
            assert torch.isfinite(hidden).all()  # the dummy rows are attended like any sequence
            through = runner.pooler(hidden[:packed.n_tokens], packed, runs)
        for a, b in zip(through, exact):
            np.testing.assert_allclose(a.values.float().numpy(), b.values.float().numpy(), atol=1e-5)


def test_which_models_and_batches_the_graphs_take():
    from torch import nn

    from poolgate.workers.engine.cuda_graphs import graphs_for

    model = nn.Linear(2, 2)
    assert graphs_for(model, "cpu", "packed_cpu_attention", 4096, 512, packed=True, grouped=False)[0] is None
    off, why = graphs_for(model, "cuda", "grouped_sdpa", 4096, 512, packed=True, grouped=False)
    assert off is None and "varlen flash" in why
    assert graphs_for(model, "cuda", "varlen_flash", 4096, 512, packed=True, grouped=True)[0] is None
    assert graphs_for(model, "cuda", "varlen_flash", 4096, 512, packed=False, grouped=False)[0] is None
    graphs, why = graphs_for(model, "cuda", "varlen_flash", 4096, 512, packed=True, grouped=False)
    assert why == "" and graphs.buckets[-1] == 4096 and graphs.reason().startswith("on:")
    small = pack([[1] * 30, [2] * 9], group_attention=False)
    assert graphs.shape(small) == GraphShape(rows=48, seqs=4, max_len=32)  # 2 real + 1 dummy of 9 rows
    assert graphs.shape(pack([[1] * 30], group_attention=True)) is None  # grouped attention: eager
    assert graphs.shape(pack([[1] * 500] * 9, group_attention=False)) is None  # over the largest bucket
    graphs.max_graphs = 0  # no room for another graph: eager
    assert graphs.shape(small) is None


def test_the_runner_pads_to_the_graph_shape_and_falls_back_when_capture_fails(minilm):
    """The runner's graph path up to capture on the CPU: prepare pads to the shape, the pooler sees the real
    sequences; capture fails here (no CUDA), which turns graphs off and runs that batch eagerly, exactly."""
    import numpy as np

    from poolgate.workers.engine.cuda_graphs import CudaGraphs

    model, seqs = minilm
    runner = model.runner
    exact = runner.run(seqs)
    grouped = runner.group_attention
    runner.group_attention = False  # as with varlen flash attention: no group plan in prepare
    runner.graphs = CudaGraphs(runner.model, 1024, model.info.max_model_len)
    try:
        prepared = runner.prepare(seqs)
        n = sum(s.num_tokens for s in seqs)
        assert prepared.graph is not None and prepared.model_input.n_tokens == prepared.graph.rows > n
        assert prepared.packed.n_tokens == n and prepared.packed.lengths == [s.num_tokens for s in seqs]
        assert prepared.packed.cu_seqlens.tolist() == prepared.model_input.cu_seqlens[:len(seqs) + 1].tolist()
        got = runner.execute(prepared)
        assert runner.graphs.failed is not None and runner.graphs.reason().startswith("off: capture failed")
        assert runner.prepare(seqs).graph is None  # eager from now on
    finally:
        runner.graphs, runner.group_attention = None, grouped
    assert [(o.start, o.stop) for o in got] == [(o.start, o.stop) for o in exact]
    for a, b in zip(got, exact):
        np.testing.assert_allclose(a.rows.values, b.rows.values, atol=1e-5)
