"""The fp32 CPU linear (``DnnLinear``: oneDNN prepacked, bias in the epilogue) against ``Linear``.

Tolerance: fp32 matmuls in another summation order (oneDNN's blocks against MKL's), so
|got - want| <= 1e-4 * (1 + |want|) elementwise (inputs ~N(0, 1), outputs up to ~10).
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.batch.packing import pack
from poolgate.workers.kernels.linear import Linear
from poolgate.workers.kernels.linear_fp32 import DnnLinear, dnn_linears
from poolgate.workers.kernels.ops import REFERENCE
from poolgate.workers.load.st_config import read_spec
from poolgate.workers.models import build_model

onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
TOL = 1e-4


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    err = ((got - want).abs() / (1 + want.abs())).max().item()
    assert err <= TOL, err


@onednn
@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 33, 513])
def test_dnn_linear_matches_the_reference(activation, bias, rows):
    torch.manual_seed(rows)
    ref = Linear(96, 160, bias=bias, activation=activation)
    x = torch.randn(rows, 96)
    with torch.no_grad():
        want = ref(x)
        got = DnnLinear(ref, activation)(x)
    _close(got, want)


@onednn
@pytest.mark.parametrize("shape", [(384, 1536), (1536, 384), (768, 3072)])
def test_dnn_linear_matches_at_the_served_models_widths(shape):
    torch.manual_seed(0)
    ref = Linear(*shape, activation="gelu" if shape[1] > shape[0] else "none")
    x = torch.randn(129, shape[0])
    with torch.no_grad():
        _close(DnnLinear(ref, ref.activation)(x), ref(x))


@onednn
def test_dnn_linears_swaps_every_linear_and_keeps_its_activation():
    torch.manual_seed(0)
    model = nn.Sequential(Linear(16, 32, activation="gelu"), nn.Sequential(Linear(32, 8, bias=False)))
    x = torch.randn(7, 16)
    with torch.no_grad():
        want = model(x)
        dnn_linears(model)
        got = model(x)
    assert isinstance(model[0], DnnLinear) and isinstance(model[1][0], DnnLinear)
    assert (model[0].activation, model[1][0].activation) == ("gelu", "none")
    _close(got, want)


@onednn
def test_a_dnn_bert_matches_the_reference(tiny_bert):
    folder, _ = tiny_bert
    spec = read_spec(WorkerConfig(model=str(folder), served_model_name="t"))
    batch = pack([[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3]])
    model, _ = build_model(spec, REFERENCE, allow_pickle=False)
    with torch.no_grad():
        want = model(batch)
        dnn_linears(model)
        got = model(batch)
    _close(got, want)
    assert F.cosine_similarity(got, want, dim=-1).min() > 0.99999
