"""``workers.tools.int8_probe``: the int8 grids, which linears it turns int8, and the cosine report."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from poolgate.workers.tools import int8_probe

pytest.importorskip("sentence_transformers")


def test_weights_sit_on_their_rows_int8_grid_within_half_a_step():
    w = torch.randn(16, 40) * torch.linspace(0.01, 5, 16)[:, None]
    q = int8_probe.int8_weight(w)
    scale = w.abs().amax(-1, keepdim=True) / 127
    steps = q / scale
    assert torch.allclose(steps, steps.round(), atol=1e-3) and steps.abs().max() <= 127 + 1e-3
    assert ((q - w).abs() <= scale / 2 + 1e-6).all()


@pytest.mark.parametrize("scheme,levels", [("sym", 255), ("asym", 256)])
def test_each_token_on_its_own_grid(scheme, levels):
    x = torch.randn(5, 64) * torch.tensor([0.1, 1, 10, 100, 3])[:, None] + torch.tensor([0, 0, 5, -50, 1])[:, None]
    q = int8_probe.int8_tokens(x, scheme)
    for row, qrow in zip(x, q, strict=True):
        span = 2 * row.abs().max() if scheme == "sym" else row.max() - row.min()
        step = span / (levels - 1)
        assert (qrow - row).abs().max() <= step / 2 + 1e-5 * row.abs().max()
        assert len(torch.unique(torch.round((qrow - qrow.min()) / step))) <= levels


def test_only_linears_outside_keep_turn_int8_and_their_inputs_are_rounded():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    x = torch.randn(3, 8)
    want = model(x)
    assert int8_probe.int8_linears(model, "sym", keep="2") == ["0"]
    got = model(x)
    assert not torch.equal(got, want)
    assert torch.allclose(got, want, atol=0.1)
    with pytest.raises(ValueError, match="one of sym, asym"):
        int8_probe.int8_linears(model, "int4")


def loud_linears(folder):
    """The tiny checkpoint's linear weights x25 (std 0.02 -> 0.5): its residual stream no longer drowns them, so
    int8 rounding shows in the pooled vectors (at std 0.02 it moved them by 6e-8, float32's own noise)."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    state = load_file(path)
    save_file({k: v * 25 if v.ndim == 2 and "embeddings" not in k else v for k, v in state.items()}, path,
              metadata={"format": "pt"})
    return str(folder)


def test_probe_reports_cosines_to_float32_and_keeping_every_linear_changes_nothing(tmp_path):
    from tests.gateway.bench.test_bench_peers import st_folder, texts

    folder = loud_linears(st_folder(tmp_path / "st", "mean", normalize=True))
    report = int8_probe.probe(folder, texts(), [("sym", ""), ("asym", ""), ("sym", "model")])
    rows = {(r["scheme"], r["keep_float32"]): r for r in report["variants"]}
    assert report["texts"] == len(texts()) and report["bar"] == 0.999
    every = rows[("sym", None)]
    assert every["int8_linears"] > 0 and 0.9 < every["worst_cosine"] < 0.99999
    assert every["worst_cosine"] <= every["mean_cosine"]
    assert rows[("asym", None)]["int8_linears"] == every["int8_linears"]
    kept = rows[("sym", "model")]
    assert kept["int8_linears"] == 0 and kept["worst_cosine"] == pytest.approx(1.0, abs=1e-6)
    assert kept["accurate"] and kept["below_0.999"] == 0
