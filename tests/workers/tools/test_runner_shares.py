"""bench-runner's extra figures: linear FLOPs per token, the measured GEMM peak, attention's share."""
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.workers.batch.packing import pack
from poolgate.workers.tools.runner_shares import attention_share, gemm_peak, linear_flops


def _model(dtype="bfloat16"):
    from poolgate.workers.load.build import load_model

    return load_model(WorkerConfig(model=str(bundled_model_path()), served_model_name="m", backend="cpu",
                                   dtype=dtype, num_threads=1))


def test_linear_flops_counts_every_projection_prepacked_or_not():
    # MiniLM-L6: 6 layers of QKV (384 -> 1152), out (384 -> 384), up (384 -> 1536), down (1536 -> 384)
    want = 6 * 2 * (384 * 1152 + 384 * 384 + 384 * 1536 + 1536 * 384)
    for dtype in ("float32", "bfloat16"):  # bf16: PackedLinear (kernels.linear), fp32: Linear
        assert linear_flops(_model(dtype).runner.model) == want


def test_attention_share_times_the_layers_attention_and_restores_it():
    runner = _model().runner
    held = [m.__dict__["attention"] for m in runner.model.modules() if "attention" in m.__dict__]
    ids = [[101] + [2000 + i] * n + [102] for i, n in enumerate((5, 40, 90, 7))]
    share = attention_share(runner.model, [pack(ids, group_attention=runner.group_attention)], lambda: None)
    assert 0.0 < share < 1.0
    assert [m.__dict__["attention"] for m in runner.model.modules() if "attention" in m.__dict__] == held
    assert torch.get_num_threads() == 1


def test_gemm_peak_reports_both_kinds():
    peak = gemm_peak(torch.device("cpu"), torch.bfloat16, 1, lambda: None)
    assert peak["dtype"] == "bfloat16" and peak["float_gflops"] > 0
    assert peak["int8_gflops"] is None or peak["int8_gflops"] > 0
