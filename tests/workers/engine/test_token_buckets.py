"""Token buckets: a batch runs as the backend's bucket of rows, and pools exactly what it would unpadded."""
import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.backends.base import Backend
from poolgate.workers.backends.cpu import CpuBackend
from poolgate.workers.batch.packing import pack, padded_rows
from poolgate.workers.engine.sequence import Sequence


def test_cpu_buckets_round_up_a_little_and_stay_few():
    b = CpuBackend()
    rows = [b.token_bucket(n) for n in range(1, 8193)]
    assert all(r >= n for n, r in zip(range(1, 8193), rows))
    assert all(r - n < max(16, n / 16) for n, r in zip(range(1, 8193), rows))  # under 16 rows or 6.25% more
    assert rows == sorted(rows) and len(set(rows)) <= 150  # a GEMM primitive per bucket, not per batch
    assert b.token_bucket(16) == 16 and b.token_bucket(17) == 32 and b.token_bucket(4000) == 4096
    assert Backend.token_bucket(b, 4000) == 4000  # other backends: exact


def test_padded_rows_adds_rows_in_no_sequence():
    b = pack([[5, 6, 7], [8, 9]], token_types=[[0, 0, 1], None])
    p = padded_rows(b, 8)
    assert p.input_ids.tolist() == [5, 6, 7, 8, 9, 0, 0, 0] and p.positions.tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    assert p.token_type_ids.tolist() == [0, 0, 1, 0, 0, 0, 0, 0] and p.seg_ids.shape[0] == 8
    assert p.cu_seqlens.tolist() == [0, 3, 5] and p.lengths == [3, 2] and p.groups is b.groups
    assert padded_rows(b, 5) is b
    with pytest.raises(ValueError, match="bucket of 4 rows for 5"):
        padded_rows(b, 4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_bucketed_batch_pools_what_the_exact_batch_pools(dtype):
    from poolgate.workers.load.build import load_model

    model = load_model(WorkerConfig(model=str(bundled_model_path()), served_model_name="m", backend="cpu",
                                    dtype=dtype, num_threads=1))
    runner = model.runner
    ids = model.encoder.encode(["a", "Hello world!", "The quick brown fox " * 9, "two words", "x y z"])
    seqs = [Sequence(s, PoolingParams(task="embed" if i != 2 else "token_embed")) for i, s in enumerate(ids)]
    prepared = runner.prepare(seqs)
    n = sum(len(s) for s in ids)
    assert prepared.packed.n_tokens == n and prepared.model_input.n_tokens == runner.backend.token_bucket(n) > n
    bucketed = runner.execute(prepared)
    runner.bucketed = False
    exact = runner.execute(runner.prepare(seqs))
    assert [(o.start, o.stop) for o in bucketed] == [(o.start, o.stop) for o in exact]
    for a, b in zip(bucketed, exact):
        assert a.rows.values.shape == b.rows.values.shape
        np.testing.assert_allclose(a.rows.values, b.rows.values, atol=1e-5 if dtype == "float32" else 2e-2)
    assert torch.get_num_threads() == 1
