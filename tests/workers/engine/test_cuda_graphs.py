"""--cuda-graphs on an NVIDIA GPU: batches replay captured graphs and pool what eager batches pool."""
import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_checkpoint

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3], [2, 3]]


def _load(folder, graphs: bool):
    pooling = "MEAN"
    return load_model(WorkerConfig(model=str(folder), served_model_name="t", backend="cuda", dtype="float16",
                                   pooler_config=PoolerConfig(seq_pooling_type=pooling), max_batch_tokens=1024,
                                   cuda_graphs=graphs, prefix_cache_mb=0))


@pytest.mark.parametrize("model_type", ["bert", "xlm-roberta"])
def test_graph_batches_pool_what_eager_batches_pool(tmp_path, model_type):
    make_tiny_checkpoint(tmp_path, model_type=model_type)
    graphs, eager = _load(tmp_path, True), _load(tmp_path, False)
    runner = graphs.runner
    if runner.graphs is None:
        pytest.skip(f"graphs not taken here: {graphs.info.kernels.get('cuda_graphs')}")
    batches = [[Sequence(s, PoolingParams()) for s in SEQS[i % 4:] + SEQS[:i % 4] + SEQS[: i % 3]] for i in range(12)]
    for batch in batches:
        prepared = runner.prepare(batch)
        assert prepared.graph is not None and prepared.model_input.n_tokens == prepared.graph.rows
        got = np.concatenate([o.rows.values for o in runner.execute(prepared)])
        want = np.concatenate([o.rows.values for o in eager.runner.run(batch)])
        np.testing.assert_allclose(got, want, atol=2e-3)
    assert runner.graphs.failed is None and 0 < len(runner.graphs.graphs) <= len(batches) + 3
    assert graphs.info.kernels["cuda_graphs"].startswith("on:")


def test_a_batch_over_the_largest_bucket_runs_eagerly(tmp_path):
    make_tiny_checkpoint(tmp_path)
    runner = _load(tmp_path, True).runner
    assert runner.graphs is not None
    long = [Sequence([2] + [7] * 60 + [3], PoolingParams()) for _ in range(20)]  # 1240 tokens > 1024
    prepared = runner.prepare(long)
    assert prepared.graph is None and len(runner.execute(prepared)) == 1
