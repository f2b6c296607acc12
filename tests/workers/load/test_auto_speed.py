"""``--dtype auto`` keeps the fast dtype on a CPU only where it is not slower than fp32, timed at load."""
import logging

import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load import auto_speed, build
from poolgate.workers.load.auto_speed import MARGIN, keeps_fast, timing_batch
from tests.fakes import make_tiny_checkpoint


def test_the_timed_batch_is_real_ids_within_the_model_limit():
    probes = [[101, 7, 8, 102], [101, 9, 102]]
    batch = timing_batch(probes, longest=512)
    assert len(batch) == auto_speed.BATCH_SEQS and {len(x) for x in batch} == {auto_speed.BATCH_LEN}
    assert set(t for x in batch for t in x) == {101, 7, 8, 102, 9}
    assert {len(x) for x in timing_batch(probes, longest=16)} == {16}


def test_the_margin_keeps_noise_from_switching():
    assert keeps_fast(1000.0, 1000.0, 1024) and keeps_fast(MARGIN * 1000.0, 1000.0, 1024)
    assert not keeps_fast(MARGIN * 1000.0 - 1.0, 1000.0, 1024)


def test_a_batch_too_short_to_time_keeps_the_fast_dtype():
    fp32_tps = 1024 / (auto_speed.MIN_TIMED_S / 2)  # fp32 ran the batch in half the shortest time that counts
    assert keeps_fast(fp32_tps / 10, fp32_tps, 1024)


def _load(folder):
    return build.load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="auto", backend="cpu"))


@pytest.mark.skipif(not build.get_backend("cpu").fast_dtype() == torch.bfloat16, reason="no bf16 on this CPU")
@pytest.mark.parametrize("bf16_faster", [True, False])
def test_auto_takes_the_timed_faster_dtype(tmp_path, monkeypatch, caplog, bf16_faster):
    """Both dtypes are timed on the real runners (the measured speeds are replaced by the test's, so the choice
    does not depend on this machine's load); the slower bf16 goes and fp32 is built again."""
    make_tiny_checkpoint(tmp_path)
    timed = []

    def speeds(runner, batch):
        timed.append(runner.dtype)
        assert auto_speed.tokens_per_s(runner, batch) > 0  # the real timing runs
        fast = runner.dtype == torch.bfloat16
        return 20_000.0 if fast == bf16_faster else 10_000.0  # 1,024 tokens in ~0.1 s: long enough to count

    monkeypatch.setattr(build, "tokens_per_s", speeds)
    with caplog.at_level(logging.INFO, logger="poolgate.worker"):
        loaded = _load(tmp_path)
    assert timed == [torch.float32, torch.bfloat16]
    assert loaded.runner.dtype == (torch.bfloat16 if bf16_faster else torch.float32)
    said = " ".join(r.getMessage() for r in caplog.records if "dtype auto" in r.getMessage())
    assert "timed here: bfloat16 " in said and ("runs slower than float32" in said) != bf16_faster
