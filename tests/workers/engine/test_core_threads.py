"""CPU core threads: a batch cut into parts by tokens, run at once, joined in order; the CPU backend's default."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.core_threads import CoreThreads, cut
from poolgate.workers.engine.sequence import Sequence


@pytest.mark.parametrize("lengths,parts,want", [
    ([5, 5, 5, 5], 2, [(0, 2), (2, 4)]),
    ([1, 1, 10], 2, [(0, 2), (2, 3)]),
    ([10, 1, 1], 2, [(0, 1), (1, 3)]),
    ([7], 2, [(0, 1)]),
    ([3, 3, 3], 4, [(0, 1), (1, 2), (2, 3)]),
    ([7] * 10, 3, [(0, 3), (3, 7), (7, 10)]),
])
def test_cut_keeps_order_and_balances_tokens(lengths, parts, want):
    assert cut(lengths, parts) == want


def test_core_threads_return_results_in_order_and_raise_the_first_error():
    threads = CoreThreads(2)
    assert threads.map(lambda x: x * x, [3, 1, 2]) == [9, 1, 4]
    with pytest.raises(ValueError, match="bad"):
        threads.map(lambda x: (_ for _ in ()).throw(ValueError("bad")) if x == 1 else x, [0, 1, 2])


def test_a_batch_cut_for_core_threads_gives_what_the_whole_batch_gives():
    from poolgate.workers.load.build import load_model

    model = load_model(WorkerConfig(model=str(bundled_model_path()), served_model_name="m", backend="cpu",
                                    dtype="float32", num_threads=1, max_batch_tokens=512))
    runner = model.runner
    ids = model.encoder.encode(["a", "Hello world!", "The quick brown fox " * 9, "two words", "x y z", "more"])
    seqs = [Sequence(s, PoolingParams(task="embed" if i != 2 else "token_embed")) for i, s in enumerate(ids)]
    whole = runner.run(seqs)
    runner.core_threads = CoreThreads(2)
    steps = []
    cut_up = runner.execute(runner.prepare(seqs), steps)
    assert [(o.start, o.stop) for o in cut_up] == [(0, 2), (2, 3), (3, 6)]  # as uncut_up: a cut run is one again
    np.testing.assert_allclose(np.concatenate([o.rows.values for o in cut_up if o.rows.offsets is None]),
                               np.concatenate([o.rows.values for o in whole if o.rows.offsets is None]), atol=1e-5)
    tokens = [o for o in cut_up if o.rows.offsets is not None][0].rows
    assert list(tokens.offsets) == [0, len(ids[2])]
    assert [name for name, _, _ in steps] == ["forward", "pool"] and steps[0][1] <= steps[0][2] <= steps[1][2]
    lopsided = [Sequence(s, PoolingParams()) for s in model.encoder.encode(["a", "a b c d e f g h i j k l m n o p"])]
    assert not hasattr(runner.prepare(lopsided), "parts")  # no cut within 70% of the tokens: runs whole, on a team
    runner.run(lopsided)
    assert torch.get_num_threads() == 2
    same = [Sequence(s, PoolingParams()) for s in model.encoder.encode(["one two", "three four"] * 2)]
    assert len(runner.prepare(same).parts) == 2
    (joined,) = runner.run(same)  # one run cut between the two parts is one run again
    assert (joined.start, joined.stop) == (0, 4) and joined.rows.values.shape[0] == 4


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_cpu_backend_runs_a_core_thread_per_core_unless_told_a_thread_count():
    code = ("import json, torch; from poolgate.workers.backends.cpu import CpuBackend; b = CpuBackend(); "
            "b.setup(None, (0, 1)); one_each = (b.core_threads(), torch.get_num_threads()); b.setup(2, (0, 1)); "
            "print(json.dumps([one_each, [b.core_threads(), torch.get_num_threads()]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    cores = json.loads(out.stdout)[0][0]
    assert json.loads(out.stdout) == [[cores, 1], [1, 2]] and cores >= 1
